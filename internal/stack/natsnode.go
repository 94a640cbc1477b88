package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tripsaga/tripsaga/internal/natssync"
)

// ClusterName is the name of the JetStream cluster `tripsaga up
// --nats-cluster N` runs.
const ClusterName = "tripsaga"

// NATSNode is one server of a JetStream cluster run as its own process
// (`tripsaga serve nats`): a client port, a route port to the other nodes
// and a store folder, all kept across restarts.
type NATSNode struct {
	Name        string   // server name, unique in the cluster (e.g. "nats-2")
	Host        string   // defaults to 127.0.0.1
	Port        int      // client port
	ClusterPort int      // route port
	Routes      []string // every node's route URL (nats://127.0.0.1:R), its own included
	ClusterName string   // defaults to [ClusterName]
	StoreDir    string   // JetStream store
	// ConfigFile, when set, is a nats-server configuration file whose
	// users (authorization: nkeys and users, with their permissions) the
	// node requires of its clients: the file natsauth.ServerConf
	// makes (up writes it into its folder; compose ships it). Routes
	// between the nodes are not users and are not affected.
	ConfigFile string
}

func (n NATSNode) options() (*server.Options, error) {
	if n.Name == "" || n.Port <= 0 || n.StoreDir == "" {
		return nil, errors.New("stack: a NATS node needs a name, a client port and a store folder")
	}
	host := n.Host
	if host == "" {
		host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName: n.Name, Host: host, Port: n.Port, JetStream: true, StoreDir: n.StoreDir,
		NoSigs: true, Logtime: true,
		// A killed peer is noticed within seconds, not after the default
		// 2-minute ping interval.
		PingInterval: 2 * time.Second, MaxPingsOut: 2,
	}
	natssync.Apply(opts)
	if n.ConfigFile != "" {
		fopts, err := server.ProcessConfigFile(n.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("nats %s: --config %s: %w", n.Name, n.ConfigFile, err)
		}
		opts.Nkeys, opts.Users, opts.NoAuthUser = fopts.Nkeys, fopts.Users, fopts.NoAuthUser
	}
	if n.ClusterPort > 0 {
		name := n.ClusterName
		if name == "" {
			name = ClusterName
		}
		// NoAdvertise: a client knows every node from its NATS_URL
		// already; told the nodes' own addresses (INFO connect_urls) a
		// client given proxies (Config.Partitions) would reconnect around
		// them, and a cut replica would not be cut.
		opts.Cluster = server.ClusterOpts{Name: name, Host: host, Port: n.ClusterPort, NoAdvertise: true}
		opts.Routes = server.RoutesFromStr(strings.Join(n.Routes, ","))
	}
	return opts, nil
}

// ServeNATSNode runs the node until ctx ends, logging to stderr. When
// health is not nil it serves GET /healthz (the server runs) and GET
// /readyz on it: 200 once the node is connected to the JetStream meta
// leader and its streams and consumers are current (nats-server's
// healthz), 503 with the reason before.
func ServeNATSNode(ctx context.Context, n NATSNode, health net.Listener) error {
	opts, err := n.options()
	if err != nil {
		return err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats %s: %w", n.Name, err)
	}
	ns.ConfigureLogger()
	go ns.Start()
	if !ns.ReadyForConnections(60 * time.Second) {
		ns.Shutdown()
		return fmt.Errorf("nats %s did not start on %s:%d", n.Name, opts.Host, n.Port)
	}
	var srv *http.Server
	if health != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !ns.Running() {
				http.Error(w, "stopped", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			st := ns.Healthz(&server.HealthzOptions{})
			if st == nil || st.Status != "ok" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(st)
				return
			}
			_, _ = w.Write([]byte("ready\n"))
		})
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(health) }()
	}
	select {
	case <-ctx.Done():
	case <-waitShutdown(ns):
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	if ctx.Err() == nil {
		return fmt.Errorf("nats %s stopped", n.Name)
	}
	return nil
}

func waitShutdown(ns *server.Server) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		ns.WaitForShutdown()
		close(ch)
	}()
	return ch
}
