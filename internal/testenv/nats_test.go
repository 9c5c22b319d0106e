package testenv

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// natsInfo reads the INFO line a nats-server sends on connect.
func natsInfo(t *testing.T, endpoint string) map[string]any {
	t.Helper()
	c, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	js, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok {
		t.Fatalf("%s greeted with %q, want INFO", endpoint, line)
	}
	var info map[string]any
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		t.Fatal(err)
	}
	return info
}

func TestStartNATS(t *testing.T) {
	s := StartNATS(t)
	info := natsInfo(t, s.Endpoint())
	if info["jetstream"] != true || info["version"] != strings.TrimPrefix(NATSServerVersion, "v") {
		t.Errorf("INFO says jetstream=%v version=%v, want true and %s", info["jetstream"], info["version"], NATSServerVersion)
	}
	s.Restart()
	natsInfo(t, s.Endpoint())
}

func TestStartNATSCluster(t *testing.T) {
	c := StartNATSCluster(t, 3)
	for _, m := range c.Members {
		if info := natsInfo(t, m.Endpoint()); info["cluster"] != "dlock" {
			t.Errorf("member %s: cluster %v, want dlock", m.Name(), info["cluster"])
		}
	}
}
