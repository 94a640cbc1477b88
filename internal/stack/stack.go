// Package stack starts the whole system on one machine: an embedded NATS
// server with JetStream (data in a folder), a private PostgreSQL cluster
// (unless a DATABASE_URL is given), the company simulators and every service
// as its own child process of the tripsaga binary, supervised: a child that
// dies (say, killed with SIGKILL) is started again, and so are the
// PostgreSQL server and the embedded NATS server, on the same ports.
// `tripsaga up`, `tripsaga demo` and the end-to-end tests all use it.
//
// A folder runs one stack at a time: a running stack holds the folder's
// [LockFile] and writes its URLs to [EnvFile].
package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

// Processes, in start order. The simulators come first: the services need
// their companies.
var Processes = []string{"sim", "hotel", "payment", "car", "trips", "reconciler"} //nolint:gochecknoglobals // read-only

// Config says where and how to run the stack.
type Config struct {
	// Dir holds nats/, pg/, logs/, [LockFile] and [EnvFile]. Required.
	// Run as root with a private cluster, Dir itself is given search
	// permission for others (o+x) so the postgres OS user can reach Dir/pg;
	// no folder above Dir is ever changed (see pgcluster.Start).
	Dir string
	// Binary is the tripsaga executable started for each child. Defaults
	// to the running executable.
	Binary string
	// DatabaseURL, when set, is used instead of a private cluster.
	DatabaseURL string
	// PGHA runs, instead of one private cluster, a pg_auto_failover pair
	// in Dir/pg-ha (pgcluster.StartHA: a monitor, a primary and its
	// synchronous standby; needs pg_autoctl, Debian's
	// postgresql-15-auto-failover): the roles and schemas are made on the
	// primary and every child gets a multi-host DATABASE_URL of both nodes
	// with target_session_attrs=read-write. [Stack.FailOver] kills the
	// primary. Refused with DatabaseURL or PostgresClockOffset.
	PGHA bool
	// BasePort: when non-zero, NATS (nats-1 in a cluster) listens on
	// BasePort and the first replica of each process on BasePort+1... in
	// [Processes] order; then come the other replicas (replica 2 of hotel,
	// payment, car, trips, reconciler, then replica 3...), then, in a
	// cluster, the client ports of nats-2..., the route ports of nats-1...
	// and the health (HTTP) ports of nats-1...: [Ports] lists them.
	// Otherwise free ports. A port in use fails [Start] with a
	// [*PortInUseError].
	BasePort int
	// Durable keeps fsync on in the private cluster.
	Durable bool
	// PostgresClockOffset runs the private cluster's clock that far ahead
	// of (or behind, negative) the machine's, by libfaketime
	// (pgcluster.Config.ClockOffset), while the services keep the
	// machine's: for tests of hosts whose clocks disagree.
	PostgresClockOffset time.Duration
	// Replicas is how many processes of every service ([Services]) run at
	// once; 0 and 1 mean one of each. The simulators ("sim") stay one.
	// The first replica of a process keeps its name ("hotel"), the others
	// are "hotel-2", "hotel-3"... (see [InstanceName]); each has its own
	// HTTP socket and its own log, logs/<instance>.log.
	Replicas int
	// NATSCluster: 0 and 1 run one embedded NATS server inside the
	// supervisor; 3 (or more) runs that many NATS servers with JetStream
	// as child processes (`tripsaga serve nats`, instances "nats-1"...),
	// clustered over loopback routes (cluster [ClusterName]), each with
	// its store in Dir/nats/n1..., restarted like any child on the same
	// ports and store. NATS_URL is then the list of their client URLs and
	// the streams get min(NATSCluster, 3) replicas (STREAM_REPLICAS). 2 is
	// refused: a JetStream cluster of two loses its quorum with either.
	NATSCluster int
	// Partitions puts a TCP proxy of its own (internal/netfault) between
	// every service replica and each PostgreSQL host and each NATS server,
	// so that [Stack.Cut] can cut one replica's network alone (chaos's
	// partition kind). The children are given the proxies' addresses in
	// DATABASE_URL and NATS_URL; the tools and [Stack.Env] keep the real
	// ones. Off by default.
	Partitions bool
	// Env is added to every child's environment (e.g. STEP_DEADLINE_MS).
	Env []string
	// Logger reports the supervisor's actions. Defaults to discard.
	Logger *slog.Logger
}

// Stack is the running system.
type Stack struct {
	cfg         Config
	NATSURL     string
	DatabaseURL string
	// Addr maps each instance (the first replica of a process has the
	// process's name, see [InstanceName]; in a NATS cluster also
	// "nats-1"..., their health endpoints) to its HTTP address
	// (host:port).
	Addr map[string]string

	// PostgresAdopted is true when a PostgreSQL server left running on the
	// private cluster (its stack was killed without stopping it) was
	// adopted instead of started; Stop stops it all the same.
	PostgresAdopted bool

	lock     *os.File
	natsOpts server.Options
	nats     *server.Server // the embedded server, when not a cluster
	pg       *pgcluster.Cluster
	// ha is the pg_auto_failover pair with Config.PGHA (pgha.go).
	ha *haPair
	// roleURLs are the PostgreSQL roles' URLs, by process (pgroles).
	roleURLs map[string]string
	// nets are the service replicas' own proxies (Config.Partitions), by
	// instance.
	nets map[string]*replicaNet
	// insts are the supervised child processes, in start order: the NATS
	// nodes (in a cluster), sim, then every replica of each service.
	insts []*instance
	mu    sync.Mutex
	procs map[string]*child
	// listeners are the instances' HTTP sockets, open for the stack's life.
	listeners map[string]*net.TCPListener
	// envOf is added, per instance, after Config.Env to its environment
	// from its next start on ([Stack.Restart]); guarded by mu.
	envOf    map[string][]string
	stopped  bool
	quit     chan struct{} // closed by Stop: ends the watch of PostgreSQL and NATS
	watching sync.WaitGroup
}

// instance is one supervised child process.
type instance struct {
	name    string   // "hotel", "hotel-2", "nats-1"
	process string   // "hotel", "nats"
	args    []string // the tripsaga command line after the binary
	// natsClient, natsRoute: a NATS node's ports (0 for the others).
	natsClient, natsRoute int
	// store is a NATS node's store folder ("" for the others).
	store string
}

// Services are the processes that run Config.Replicas times: every one of
// [Processes] but the simulators.
var Services = []string{"hotel", "payment", "car", "trips", "reconciler"} //nolint:gochecknoglobals // read-only

// InstanceName names replica r (from 1) of a process: the first keeps the
// process's name ("hotel"), the others are "hotel-2", "hotel-3"...; the
// NATS nodes of a cluster are always numbered ("nats-1").
func InstanceName(process string, r int) string {
	if r <= 1 && process != "nats" {
		return process
	}
	return process + "-" + strconv.Itoa(max(r, 1))
}

// PortInUseError is returned by [Start] when Config.BasePort is set and
// one of the ports it needs is taken.
type PortInUseError struct {
	Port int
	// For names what the port was for: "NATS", an instance name, or a
	// NATS node's "nats-2 routes" or "nats-2 health".
	For string
	Err error
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("stack: port %d (for %s) is in use: %v", e.Port, e.For, e.Err)
}

func (e *PortInUseError) Unwrap() error { return e.Err }

type child struct {
	name     string
	cmd      *exec.Cmd
	done     chan struct{}
	restarts int
	killed   bool // by Stack.Kill, on purpose; guarded by Stack.mu
	// emptyStore: restart it with its store folder emptied
	// ([Stack.KillEmptyStore]); guarded by Stack.mu.
	emptyStore bool
	started    time.Time
	// quickExits counts exits in a row within 5 s of a start (guarded by
	// Stack.mu), for the restart backoff.
	quickExits int
	// sameExits counts the quick exits in a row whose last log line was
	// lastExit (guarded by Stack.mu): a process that fails its start the
	// same way [GiveUpAfter] times will not start by being restarted.
	sameExits int
	lastExit  string
	// wasReady: the instance answered ready once (to [Stack.WaitReady]);
	// from then on it is restarted and waited for however it fails
	// (guarded by Stack.mu).
	wasReady bool
}

// GiveUpAfter is how many quick exits in a row (within 5 s of a start),
// each with the same last log line, make [Stack.WaitReady] stop waiting
// for the process: a refused configuration (a bad policy file, a bad
// variable) fails every start the same way, so restarting it more cannot
// help, and `up` stops everything and says why instead of restarting it
// forever. A process that dies at once for changing reasons (its peers
// still starting), or one that was ready once (a fault in a chaos run
// may make it fail a few restarts alike), is waited for as before.
const GiveUpAfter = 3

// StartFailedError is returned by [Stack.WaitReady] for a process that
// exited [GiveUpAfter] times in a row right after its start with the
// same last log line (LastLine, e.g. `tripsaga: trips: CANCELLATION_POLICY_FILE ...`).
type StartFailedError struct {
	Process  string
	Exits    int
	LastLine string
	Log      string // the path of its log file
}

func (e *StartFailedError) Error() string {
	return fmt.Sprintf("stack: %s failed its start %d times in a row, each time with: %s (log %s)", e.Process, e.Exits, e.LastLine, e.Log)
}

// lastLogLine returns the last non-blank line of the log file at path
// (its last 4 kB), or "".
func lastLogLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-4096, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(buf)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// URL returns the base URL of an instance ("http://127.0.0.1:port"); a
// process's name is its first replica.
func (s *Stack) URL(name string) string { return "http://" + s.Addr[name] }

// URLs returns the base URLs of every replica of a process, the first
// replica's first ("sim": one; "nats": the nodes' health endpoints in a
// cluster, none otherwise).
func (s *Stack) URLs(process string) []string {
	var out []string
	for _, in := range s.insts {
		if in.process == process {
			out = append(out, s.URL(in.name))
		}
	}
	return out
}

// Instances returns the name of every supervised child process, in start
// order: "nats-1"... in a cluster (the single embedded server is no child
// and is not listed), "sim", then every replica of each service
// ("hotel", "hotel-2", "payment", ...). [Stack.Kill], [Stack.Pid],
// [Stack.WaitReady] and [Stack.LogPath] take these names.
func (s *Stack) Instances() []string {
	out := make([]string, len(s.insts))
	for i, in := range s.insts {
		out[i] = in.name
	}
	return out
}

// StreamReplicas is the replica count the services create the streams
// with (STREAM_REPLICAS): min(NATSCluster, 3) in a cluster, else 1.
func (s *Stack) StreamReplicas() int { return streamReplicas(s.cfg) }

func streamReplicas(cfg Config) int {
	if cfg.NATSCluster > 1 {
		return min(cfg.NATSCluster, 3)
	}
	return 1
}

// CompanyURLs returns HOTEL_URL, PAYMENTS_URL, CARS_URL and MAIL_URL, and
// the URL of each optional step's company the stack runs (INSURER_URL with
// the insurance step on).
func (s *Stack) CompanyURLs() map[string]string {
	sim := s.URL("sim")
	urls := map[string]string{
		"HOTEL_URL": sim + "/hotel", "PAYMENTS_URL": sim + "/payments", "CARS_URL": sim + "/cars", "MAIL_URL": sim + "/mail",
	}
	for _, svc := range optionalServices(s.cfg) {
		if c, ok := optionalCompanies[svc]; ok {
			urls[c.variable] = sim + c.path
		}
	}
	return urls
}

// Port is one port of a BasePort layout and what it is for.
type Port struct {
	Port int
	For  string // "NATS", an instance name, "nats-2 routes", "nats-2 health"
}

// Ports returns the ports a stack of cfg listens on when cfg.BasePort is
// set, in order from BasePort: NATS (nats-1's clients in a cluster), the
// first replica of each of [Processes], the other replicas (replica 2 of
// each of [Services], then replica 3...), then in a cluster the client
// ports of nats-2..., the route ports of nats-1... and the health ports of
// nats-1.... With BasePort 0 the same list has port 0 for each.
func Ports(cfg Config) []Port {
	base := cfg.BasePort
	var out []Port
	add := func(what string) {
		p := 0
		if base != 0 {
			p = base + len(out)
		}
		out = append(out, Port{Port: p, For: what})
	}
	add("NATS")
	for _, name := range processesOf(cfg) {
		add(name)
	}
	for r := 2; r <= cfg.Replicas; r++ {
		for _, name := range servicesOf(cfg) {
			add(InstanceName(name, r))
		}
	}
	if n := cfg.NATSCluster; n > 1 {
		for i := 2; i <= n; i++ {
			add(InstanceName("nats", i))
		}
		for i := 1; i <= n; i++ {
			add(InstanceName("nats", i) + " routes")
		}
		for i := 1; i <= n; i++ {
			add(InstanceName("nats", i) + " health")
		}
	}
	return out
}

// Start brings the whole stack up and waits until every process is ready
// (GET /readyz answers 200). Errors wrap [ErrDirInUse] when another stack
// runs in cfg.Dir, or are a [*PortInUseError] when a port of
// cfg.BasePort's range is taken.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Dir == "" {
		return nil, errors.New("stack: Dir is required")
	}
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("stack: Replicas %d: want 1 or more (0 means 1)", cfg.Replicas)
	}
	if cfg.NATSCluster < 0 || cfg.NATSCluster == 2 {
		return nil, fmt.Errorf("stack: NATSCluster %d: want 0 or 1 (one embedded server) or 3 or more (a JetStream cluster of two loses its quorum with either node)", cfg.NATSCluster)
	}
	if _, err := events.ParseSteps(steps(cfg)); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := checkPGHA(cfg); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Binary = exe
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, Addr: map[string]string{}, procs: map[string]*child{}, listeners: map[string]*net.TCPListener{}, lock: lock, quit: make(chan struct{})}
	if err := s.start(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	s.watching.Add(1)
	go s.watch()
	return s, nil
}

func (s *Stack) start(ctx context.Context) error {
	cfg := s.cfg
	for _, d := range []string{"nats", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(cfg.Dir, EnvFile)) // a killed stack's
	ports := Ports(cfg)
	if cfg.BasePort != 0 {
		if err := checkPorts(ports); err != nil {
			return err
		}
	}
	portOf := map[string]int{}
	for _, p := range ports {
		portOf[p.For] = p.Port
	}
	// Every process connects to NATS as its own identity
	// (natsauth), its seed in Dir/auth.
	natsIDs, pubs, err := s.provisionNATS()
	if err != nil {
		return err
	}
	// The children, in start order.
	if n := cfg.NATSCluster; n > 1 {
		if err := s.planCluster(n, portOf); err != nil {
			return err
		}
	}
	s.insts = append(s.insts, &instance{name: "sim", process: "sim", args: []string{"serve", "sim"}})
	for _, name := range servicesOf(cfg) {
		for r := 1; r <= max(cfg.Replicas, 1); r++ {
			s.insts = append(s.insts, &instance{name: InstanceName(name, r), process: name, args: []string{"serve", name}})
		}
	}
	// The supervisor listens on every instance's HTTP address itself and
	// hands the socket to the process (process.ListenFDEnv): a free port
	// cannot be taken by another program before the process binds it, and
	// a restarted process gets the same socket.
	for _, in := range s.insts {
		what := in.name
		if in.process == "nats" {
			what += " health"
		}
		port := portOf[what]
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			return &PortInUseError{Port: port, For: what, Err: err}
		}
		s.listeners[in.name] = l.(*net.TCPListener)
		s.Addr[in.name] = l.Addr().String()
	}
	if cfg.NATSCluster > 1 {
		// The nodes start while PostgreSQL does; the services wait for
		// their meta leader (each node's /readyz).
		for _, in := range s.insts {
			if in.process == "nats" {
				if err := s.startChild(in); err != nil {
					return err
				}
			}
		}
	} else {
		natsPort := -1
		if cfg.BasePort != 0 {
			natsPort = cfg.BasePort
		}
		s.natsOpts = embeddedNATSOptions(filepath.Join(cfg.Dir, "nats"), natsPort)
		if err := natsauth.Configure(&s.natsOpts, natsIDs, pubs); err != nil {
			return err
		}
		ns, err := startNATS(s.natsOpts)
		if err != nil {
			return err
		}
		s.nats = ns
		s.NATSURL = ns.ClientURL()
		// Restarts listen where the children already point.
		s.natsOpts.Port = ns.Addr().(*net.TCPAddr).Port
	}
	s.DatabaseURL = cfg.DatabaseURL
	if cfg.PGHA {
		if err := s.startPGHA(ctx); err != nil {
			return err
		}
	}
	if s.DatabaseURL == "" {
		if os.Geteuid() == 0 {
			if err := allowSearch(cfg.Dir); err != nil {
				return err
			}
		}
		pg, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(cfg.Dir, "pg"), Durable: cfg.Durable, ClockOffset: cfg.PostgresClockOffset})
		if err != nil {
			return err
		}
		s.pg = pg
		s.DatabaseURL = pg.URL
		if pg.Adopted {
			s.PostgresAdopted = true
			cfg.Logger.Warn("adopted a PostgreSQL server left running in this folder (an earlier stack here was killed without stopping it); it is stopped with this one",
				"pid", pg.Pid(), "port", pg.Port, "data", pg.DataDir)
		}
	}
	// One login role per process, owning its schema (internal/pgroles),
	// with new passwords on every start: each child gets its role's URL,
	// and DatabaseURL stays the administrator's, for the tools. Schemas of
	// an earlier version (owned by the administrator) are handed over.
	roleURLs, err := pgroles.Bootstrap(ctx, s.DatabaseURL, pgroles.Default(), pgroles.Passwords(pgroles.Default()))
	if err != nil {
		return fmt.Errorf("stack: PostgreSQL roles (DATABASE_URL must be a superuser's, or a CREATEROLE role's that may own the schemas): %w", err)
	}
	s.roleURLs = roleURLs
	if cfg.Partitions {
		if err := s.startProxies(); err != nil {
			return err
		}
	}
	for _, in := range s.insts {
		if in.process == "nats" {
			// A JetStream cluster creates no stream before it has a meta
			// leader: every node must be in it first.
			if err := s.WaitReady(ctx, in.name); err != nil {
				return err
			}
		}
	}
	// up creates every stream (as natsauth.Admin) before the services
	// start; each service may create or update only its own.
	if err := s.ensureStreams(ctx); err != nil {
		return err
	}
	for _, in := range s.insts {
		if in.process == "nats" {
			continue
		}
		if err := s.startChild(in); err != nil {
			return err
		}
		if in.name == "sim" { // the services need their companies first
			if err := s.WaitReady(ctx, "sim"); err != nil {
				return err
			}
		}
	}
	for _, in := range s.insts {
		if err := s.WaitReady(ctx, in.name); err != nil {
			if err = s.waitReadyOnPair(ctx, in.name, err); err != nil {
				return err
			}
		}
	}
	return s.writeEnvFile()
}

// ensureStreams creates every stream (with [Stack.StreamReplicas]
// replicas), as natsauth.Admin, before the services start, so that ten
// processes do not race to create them; each service ensures its own
// again.
func (s *Stack) ensureStreams(ctx context.Context) error {
	nc, err := s.ConnectNATS(natsauth.Admin)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("stack: jetstream: %w", err)
	}
	if err := process.WaitJetStream(ctx, js, time.Minute); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	if err := process.EnsureStreams(ctx, js, s.natsCatalogue(), natsauth.Admin, s.StreamReplicas(), time.Minute); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return nil
}

// planCluster adds the n NATS nodes to s.insts with their client and
// route ports (from portOf, or free ones when 0) and sets NATSURL.
func (s *Stack) planCluster(n int, portOf map[string]int) error {
	client := make([]int, n+1)
	route := make([]int, n+1)
	var free []net.Listener
	defer func() {
		for _, l := range free {
			l.Close()
		}
	}()
	pick := func(p int) (int, error) {
		if p != 0 {
			return p, nil
		}
		// A free port, held until all are chosen so none comes twice; the
		// node binds it a moment later.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("stack: no free port for NATS: %w", err)
		}
		free = append(free, l)
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	var err error
	for i := 1; i <= n; i++ {
		name := InstanceName("nats", i)
		what := name
		if i == 1 {
			what = "NATS"
		}
		if client[i], err = pick(portOf[what]); err != nil {
			return err
		}
		if route[i], err = pick(portOf[name+" routes"]); err != nil {
			return err
		}
	}
	var routes, urls []string
	for i := 1; i <= n; i++ {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(route[i]))
		urls = append(urls, "nats://127.0.0.1:"+strconv.Itoa(client[i]))
	}
	for i := 1; i <= n; i++ {
		name := InstanceName("nats", i)
		store := filepath.Join(s.cfg.Dir, "nats", "n"+strconv.Itoa(i))
		if err := os.MkdirAll(store, 0o755); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		s.insts = append(s.insts, &instance{
			name: name, process: "nats", natsClient: client[i], natsRoute: route[i], store: store,
			args: []string{"serve", "nats", "--name", name, "--port", strconv.Itoa(client[i]),
				"--cluster-port", strconv.Itoa(route[i]), "--routes", strings.Join(routes, ","),
				"--cluster-name", ClusterName, "--store", store,
				"--config", filepath.Join(s.cfg.Dir, NATSConf)},
		})
	}
	s.NATSURL = strings.Join(urls, ",")
	return nil
}

// checkPorts fails with a [*PortInUseError] naming the first port that
// cannot be listened on.
func checkPorts(ports []Port) error {
	for _, p := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.Port))
		if err != nil {
			return &PortInUseError{Port: p.Port, For: p.For, Err: err}
		}
		l.Close()
	}
	return nil
}

// embeddedNATSOptions are the options of the single embedded server: its
// store in dir, its client port (-1 for any), the sync policy of
// internal/natssync.
func embeddedNATSOptions(dir string, port int) server.Options {
	o := server.Options{
		ServerName: "tripsaga", Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true,
	}
	natssync.Apply(&o)
	return o
}

func startNATS(opts server.Options) (*server.Server, error) {
	ns, err := server.NewServer(&opts)
	if err != nil {
		return nil, fmt.Errorf("stack: nats: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("stack: embedded NATS did not start on 127.0.0.1:%d", opts.Port)
	}
	if !ns.JetStreamEnabled() {
		ns.Shutdown()
		return nil, fmt.Errorf("stack: embedded NATS started without JetStream (store %s)", opts.StoreDir)
	}
	return ns, nil
}

// allowSearch adds o+x to dir itself (the folder the stack was given, never
// one above it), so the postgres OS user can reach dir/pg.
func allowSearch(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	if fi.Mode().Perm()&0o001 != 0 {
		return nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()|0o001); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return nil
}

// watch supervises PostgreSQL (the private cluster's postmaster) and the
// embedded NATS server until Stop: one that died is started again on the
// same port, and the Logger says so. (NATS nodes of a cluster are children,
// restarted as children are.)
func (s *Stack) watch() {
	defer s.watching.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		if s.pg != nil && !s.pg.Alive() {
			s.restartPostgres()
		}
		s.superviseHA()
		s.mu.Lock()
		ns := s.nats
		s.mu.Unlock()
		if ns != nil && (!ns.Running() || !ns.JetStreamEnabled()) {
			s.restartNATS(ns)
		}
	}
}

// retry calls f until it succeeds or Stop, waiting 250 ms doubling to 5 s
// between attempts; it reports whether f succeeded.
func (s *Stack) retry(what string, f func(context.Context) error) bool {
	wait := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return true
		}
		// The first attempts after a kill often fail while the dead
		// server's backends exit; the full error is in its log.
		s.cfg.Logger.Warn(what+" failed; trying again", "attempt", attempt, "in", wait, "err", lastLine(err))
		select {
		case <-s.quit:
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (s *Stack) restartPostgres() {
	s.cfg.Logger.Warn("PostgreSQL exited; restarting it", "pid", s.pg.Pid(), "port", s.pg.Port, "log", filepath.Join(filepath.Dir(s.pg.DataDir), "postgres.log"))
	if s.retry("PostgreSQL restart", s.pg.Restart) {
		s.cfg.Logger.Warn("PostgreSQL restarted", "pid", s.pg.Pid(), "port", s.pg.Port)
	}
}

func (s *Stack) restartNATS(old *server.Server) {
	s.cfg.Logger.Warn("embedded NATS stopped; restarting it", "url", redact.URL(s.NATSURL))
	old.Shutdown()
	old.WaitForShutdown()
	var ns *server.Server
	if !s.retry("NATS restart", func(context.Context) error {
		var err error
		ns, err = startNATS(s.natsOpts)
		return err
	}) {
		return
	}
	s.mu.Lock()
	s.nats = ns
	s.mu.Unlock()
	s.cfg.Logger.Warn("embedded NATS restarted", "url", redact.URL(s.NATSURL))
}

// LogPath returns the log file of an instance (logs/<instance>.log).
func (s *Stack) LogPath(name string) string { return filepath.Join(s.cfg.Dir, "logs", name+".log") }

// InstanceEnv names the environment variable that tells each child its
// instance name ("hotel-2", "nats-1").
const InstanceEnv = "TRIPSAGA_INSTANCE"

func (s *Stack) env(name string) []string {
	// OPS_ADDR from up's own environment is not handed down: every child
	// would listen on the one address (Config.Env may set it).
	env := append(os.Environ(), "OPS_ADDR=",
		"NATS_URL="+s.natsURLOf(name), "DATABASE_URL="+s.databaseURL(name), "HTTP_ADDR="+s.Addr[name],
		"STREAM_REPLICAS="+strconv.Itoa(s.StreamReplicas()), InstanceEnv+"="+name)
	for k, v := range s.CompanyURLs() {
		env = append(env, k+"="+v)
	}
	env = append(env, "TRIPS_URL="+s.URL("trips"))
	// The reconciler reads the services' step logs and incidents
	// (reconciler.ServiceURLsEnv).
	var ops []string
	for _, svc := range servicesOf(s.cfg) {
		if svc != "reconciler" {
			ops = append(ops, svc+"="+s.URL(svc))
		}
	}
	env = append(env, "SERVICE_URLS="+strings.Join(ops, ","))
	env = append(env, s.natsEnv(name)...)
	env = append(env, s.cfg.Env...)
	s.mu.Lock()
	env = append(env, s.envOf[name]...) // Restart's, last: it wins
	s.mu.Unlock()
	// The operators' token (reconciler.OperatorTokenEnv) is the reconciler's
	// alone: no other child gets it, from up's environment or Config.Env.
	if s.processOf(name) != "reconciler" {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "OPERATOR_TOKEN=") })
	}
	return env
}

// processOf returns the process an instance runs ("hotel" for "hotel-2"),
// or "" for a name that is none of the stack's.
func (s *Stack) processOf(name string) string {
	for _, in := range s.insts {
		if in.name == name {
			return in.process
		}
	}
	return ""
}

// databaseURL is the DATABASE_URL of instance name: its process's role
// (pgroles.ForProcess), through its own proxy with Config.Partitions, or
// none for a NATS node.
func (s *Stack) databaseURL(name string) string {
	if rn := s.nets[name]; rn != nil {
		return rn.pgURL
	}
	for _, in := range s.insts {
		if in.name == name {
			return s.roleURLs[in.process]
		}
	}
	return ""
}

// natsURLOf is the NATS_URL of instance name: [Stack.NATSURL], through
// its own proxies with Config.Partitions.
func (s *Stack) natsURLOf(name string) string {
	if rn := s.nets[name]; rn != nil {
		return rn.natsURL
	}
	return s.NATSURL
}

// RoleURL returns the URL of a process's PostgreSQL role ("hotel", "sim"),
// as its children are given it: for tests that check what a role may do.
func (s *Stack) RoleURL(process string) string { return s.roleURLs[process] }

func (s *Stack) startChild(in *instance) error {
	name := in.name
	logf, err := os.OpenFile(s.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.cfg.Binary, in.args...)
	cmd.Env = s.env(name)
	cmd.Stdout, cmd.Stderr = logf, logf
	if l := s.listeners[name]; l != nil {
		f, err := l.File() // a dup: the child's fd 3
		if err != nil {
			logf.Close()
			return fmt.Errorf("stack: socket of %s: %w", name, err)
		}
		defer f.Close()
		cmd.ExtraFiles = []*os.File{f}
		cmd.Env = append(cmd.Env, process.ListenFDEnv+"=3")
	}
	// Own process group: a Ctrl-C at the terminal reaches the supervisor,
	// which stops the services in order. Pdeathsig: if the supervisor itself
	// is killed, its children get SIGTERM instead of living on as orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("stack: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), started: time.Now()}
	s.mu.Lock()
	if old := s.procs[name]; old != nil {
		c.restarts = old.restarts + 1
		c.quickExits = old.quickExits
		c.sameExits, c.lastExit, c.wasReady = old.sameExits, old.lastExit, old.wasReady
	}
	s.procs[name] = c
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		close(c.done)
		s.mu.Lock()
		stopped, killed := s.stopped, c.killed
		s.mu.Unlock()
		if stopped {
			return
		}
		// A process that keeps dying at once is restarted less and less
		// often (200 ms doubling to 10 s), and its last log line says why.
		delay := 200 * time.Millisecond
		line := lastLogLine(s.LogPath(name))
		s.mu.Lock()
		if time.Since(c.started) < 5*time.Second && !killed {
			c.quickExits++
			delay = min(delay<<min(c.quickExits-1, 6), 10*time.Second)
			if line != "" && line == c.lastExit {
				c.sameExits++
			} else {
				c.sameExits, c.lastExit = 1, line
			}
		} else {
			c.quickExits, c.sameExits, c.lastExit = 0, 0, ""
		}
		s.mu.Unlock()
		if killed {
			s.cfg.Logger.Warn("process exited; restarting", "process", name, "err", err, "cause", "Stack.Kill, on purpose")
		} else {
			s.cfg.Logger.Warn("process exited; restarting", "process", name, "err", err, "in", delay, "last_log", line, "log", s.LogPath(name))
		}
		time.Sleep(delay)
		s.mu.Lock()
		stopped = s.stopped
		empty := c.emptyStore
		s.mu.Unlock()
		if empty && in.store != "" {
			if err := emptyDir(in.store); err != nil {
				s.cfg.Logger.Error("cannot empty the store", "process", name, "store", in.store, "err", err)
			}
		}
		if !stopped {
			if err := s.startChild(in); err != nil {
				s.cfg.Logger.Error("restart failed", "process", name, "err", err)
			}
		}
	}()
	return nil
}

// Kill sends SIGKILL to an instance ([Stack.Instances]: "payment",
// "payment-2", "nats-2") and waits until it is dead. The supervisor
// starts it again; wait for it with [Stack.WaitReady].
func (s *Stack) Kill(name string) (pid int, err error) {
	s.mu.Lock()
	c := s.procs[name]
	s.mu.Unlock()
	if c == nil {
		return 0, fmt.Errorf("stack: no process %s", name)
	}
	pid = c.cmd.Process.Pid
	s.mu.Lock()
	c.killed = true
	s.mu.Unlock()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return pid, err
	}
	<-c.done
	return pid, nil
}

// Restart stops an instance ([Stack.Instances]) as an operator's rolling
// restart does (SIGTERM, SIGKILL after 10 s), has the supervisor start it
// again with env ("STEPS=hotel,insurance,payment,car") added to its
// environment after [Config.Env] (kept for its later restarts too; a
// later Restart's env replaces it), and waits until the new process is
// ready or ctx ends. The instance's socket is the supervisor's, so no request is
// refused meanwhile: they wait for the new process.
func (s *Stack) Restart(ctx context.Context, name string, env ...string) error {
	s.mu.Lock()
	c := s.procs[name]
	if c != nil {
		if s.envOf == nil {
			s.envOf = map[string][]string{}
		}
		s.envOf[name] = slices.Clone(env)
		c.killed = true // on purpose: restarted at once, no backoff
	}
	s.mu.Unlock()
	if c == nil {
		return fmt.Errorf("stack: no process %s", name)
	}
	old := c.cmd.Process.Pid
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	case <-ctx.Done():
		return ctx.Err()
	}
	for s.Pid(name) == old {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	for {
		// Until ctx ends, not WaitReady's minute: on a loaded machine a
		// recovery pass under traffic can take longer.
		err := s.WaitReady(ctx, name)
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
}

// KillEmptyStore SIGKILLs a NATS node of a cluster ("nats-2") like
// [Stack.Kill], and the supervisor starts it again with its store folder
// emptied, as a node whose disk was lost: it catches its streams up from
// its peers. Wait for it with [Stack.WaitReady].
func (s *Stack) KillEmptyStore(name string) (pid int, err error) {
	s.mu.Lock()
	c := s.procs[name]
	var store string
	for _, in := range s.insts {
		if in.name == name {
			store = in.store
		}
	}
	if c != nil && store != "" {
		c.emptyStore = true
	}
	s.mu.Unlock()
	if store == "" {
		return 0, fmt.Errorf("stack: %s is not a NATS node of a cluster", name)
	}
	return s.Kill(name)
}

// emptyDir removes everything inside dir, keeping dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Pid returns the current pid of an instance (0 if unknown).
func (s *Stack) Pid(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.procs[name]; c != nil {
		return c.cmd.Process.Pid
	}
	return 0
}

// WaitReady waits until an instance answers 200 on GET /readyz (at most
// 60 s). A NATS node is ready once it is in the cluster with a meta leader
// and its streams and consumers are current. It gives up at once, with a
// [*StartFailedError], on an instance that was never ready and has failed
// its start the same way [GiveUpAfter] times in a row.
func (s *Stack) WaitReady(ctx context.Context, name string) error {
	if _, ok := s.Addr[name]; !ok {
		return fmt.Errorf("stack: no process %s", name)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// The stack holds each process's socket across its restarts, so a
	// request to a process that is not running waits in the listen
	// backlog instead of being refused: a watcher ends the wait with a
	// [*StartFailedError] once the process gives up its start.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := s.startFailed(name); err != nil {
					fail(err)
					return
				}
			}
		}
	}()
	url := s.URL(name) + "/readyz"
	last := "no answer yet"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 2000))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				s.mu.Lock()
				if c := s.procs[name]; c != nil {
					c.wasReady = true
				}
				s.mu.Unlock()
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.Join(strings.Fields(string(body)), " "))
		} else if ctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			var sf *StartFailedError
			if errors.As(context.Cause(ctx), &sf) {
				return sf
			}
			tail, _ := os.ReadFile(s.LogPath(name))
			if len(tail) > 3000 {
				tail = tail[len(tail)-3000:]
			}
			// The first line says what /readyz last answered: a caller
			// that keeps one line (the chaos report) keeps why.
			return fmt.Errorf("stack: %s not ready, /readyz last answered: %s (log %s):\n%s", name, last, s.LogPath(name), tail)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startFailed returns a [*StartFailedError] if the process name has
// failed its start the same way [GiveUpAfter] times in a row, else nil.
func (s *Stack) startFailed(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.procs[name]
	if c == nil || c.wasReady || c.sameExits < GiveUpAfter {
		return nil
	}
	return &StartFailedError{Process: name, Exits: c.sameExits, LastLine: c.lastExit, Log: s.LogPath(name)}
}

// Stop stops the services (SIGTERM, then SIGKILL after 10 s), newest
// replica first, then the simulators, PostgreSQL and NATS (the embedded
// server, or the cluster's nodes), removes [EnvFile] and releases the
// folder's lock. Calling it again does nothing.
func (s *Stack) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	procs := s.procs
	s.mu.Unlock()
	close(s.quit)
	s.watching.Wait()
	_ = os.Remove(filepath.Join(s.cfg.Dir, EnvFile))
	stop := func(nats bool) {
		for i := len(s.insts) - 1; i >= 0; i-- {
			in := s.insts[i]
			c := procs[in.name]
			if c == nil || (in.process == "nats") != nats {
				continue
			}
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.done:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}
	}
	stop(false)
	if s.pg != nil {
		if err := s.pg.Stop(); err != nil {
			s.cfg.Logger.Error("postgres stop", "err", err)
		}
	}
	s.stopPGHA()
	stop(true)
	s.stopProxies()
	for _, l := range s.listeners {
		_ = l.Close()
	}
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
	}
	if s.lock != nil {
		s.lock.Close() // releases the folder's lock
	}
}

// lastLine returns the last non-blank line of err's text.
func lastLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
