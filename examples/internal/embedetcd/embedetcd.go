// Package embedetcd starts a single-member etcd server inside the process, so
// that the examples run with nothing installed.
package embedetcd

import (
	"errors"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a single-member etcd server running inside this process.
type Server struct {
	e    *embed.Etcd
	dir  string
	Addr string // client address, 127.0.0.1:PORT
}

// DSN returns the dlock DSN of the server with the key prefix prefix
// ("/quickstart", say).
func (s *Server) DSN(prefix string) string { return "etcd://" + s.Addr + prefix }

// Start starts an etcd server named name in a temporary directory, listening
// on free loopback ports, with its logs off. Its 10ms heartbeat and 100ms
// election timeout (etcd's defaults are 100ms and 1s) make it ready in well
// under a second and let leases be as short as 1s.
func Start(name string) (*Server, error) {
	dir, err := os.MkdirTemp("", "dlock-"+name+"-etcd-")
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	// Port 0: the kernel picks free ports. The peer URL is never dialled by a
	// single-member cluster.
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{local}, []url.URL{local}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{local}, []url.URL{local}
	cfg.InitialCluster = cfg.Name + "=" + local.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	srv := &Server{e: e, dir: dir}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		srv.Close()
		return nil, err
	case <-time.After(30 * time.Second):
		srv.Close()
		return nil, errors.New("not ready after 30s")
	}
	srv.Addr = e.Clients[0].Addr().String()
	return srv, nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.e.Close()
	_ = os.RemoveAll(s.dir)
}
