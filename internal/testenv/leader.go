package testenv

import "testing"

// member is what a cluster's Leader returns: a server the test can pause,
// resume, kill and restart (an *Etcd or a *ZooKeeper).
type member interface {
	Pause()
	Resume()
	Kill()
	Restart()
}

// StallLeader stops the current leader, as leader(t) reports it, with
// SIGSTOP, and returns a heal that resumes it and returns once leader(t)
// finds a leader again (EtcdCluster.Leader, ZooKeeperEnsemble.Leader).
func StallLeader[M member](t testing.TB, leader func(testing.TB) M) (heal func()) {
	t.Helper()
	m := leader(t)
	m.Pause()
	return func() {
		m.Resume()
		leader(t)
	}
}

// KillLeader kills the current leader, as leader(t) reports it, with
// SIGKILL, and returns a heal that restarts it on its data and returns once
// leader(t) finds a leader again.
func KillLeader[M member](t testing.TB, leader func(testing.TB) M) (heal func()) {
	t.Helper()
	m := leader(t)
	m.Kill()
	return func() {
		m.Restart()
		leader(t)
	}
}
