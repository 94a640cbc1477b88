package main

import (
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/process"
)

// serveNATSCmd is `tripsaga serve nats`: one NATS server with JetStream,
// a node of the cluster `tripsaga up --nats-cluster 3` runs as child
// processes.
func serveNATSCmd() *cobra.Command {
	var n stack.NATSNode
	var routes string
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Run one NATS server with JetStream (a node of a cluster: --cluster-port and --routes), as tripsaga up --nats-cluster 3 does",
		Long: `serve nats runs one NATS server with JetStream (github.com/nats-io/nats-server,
embedded), its store in --store. With --cluster-port and --routes it is a
node of a JetStream cluster (the routes list every node's route URL, its own
may be included). tripsaga up --nats-cluster 3 runs three, each as its own
child process it restarts on the same ports and store.

When HTTP_ADDR (or the socket a supervisor hands down, TRIPSAGA_LISTEN_FD)
is set, it serves GET /healthz and GET /readyz there: ready once the node
is in the cluster with a meta leader and its streams and consumers are
current (nats-server's healthz).

With --config it requires its clients to be the users of that
nats-server configuration file (tripsaga up writes D/nats-server.conf,
the identities of natsauth; compose ships the same file).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if routes != "" {
				n.Routes = strings.Split(routes, ",")
			}
			var health net.Listener
			if addr := os.Getenv("HTTP_ADDR"); addr != "" || os.Getenv(process.ListenFDEnv) != "" {
				l, err := process.Listen(addr)
				if err != nil {
					return err
				}
				health = l
			}
			return stack.ServeNATSNode(cmd.Context(), n, health)
		},
	}
	f := cmd.Flags()
	f.StringVar(&n.Name, "name", "nats-1", "server name, unique in the cluster")
	f.StringVar(&n.Host, "host", "127.0.0.1", "address the client and route ports listen on")
	f.IntVar(&n.Port, "port", 4222, "client port")
	f.IntVar(&n.ClusterPort, "cluster-port", 0, "route port for the other nodes (0 = no cluster)")
	f.StringVar(&routes, "routes", "", "comma-separated route URLs of every node (nats://127.0.0.1:6222,...)")
	f.StringVar(&n.ClusterName, "cluster-name", stack.ClusterName, "cluster name")
	f.StringVar(&n.StoreDir, "store", "", "JetStream store `folder` (required)")
	f.StringVar(&n.ConfigFile, "config", "", "nats-server configuration `file` whose users (with their permissions) clients must be, as natsauth makes it (tripsaga up writes one)")
	_ = cmd.MarkFlagRequired("store")
	return cmd
}
