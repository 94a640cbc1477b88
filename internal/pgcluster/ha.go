package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoAutoFailover is returned by [StartHA] when pg_autoctl (Debian's
// postgresql-15-auto-failover, pg_auto_failover 2.0) is not installed.
var ErrNoAutoFailover = errors.New("pgcluster: pg_autoctl not found; install pg_auto_failover (apt-get install postgresql-15-auto-failover)")

// HAConfig says where and how to run a highly available pair.
type HAConfig struct {
	// Dir holds the monitor (Dir/monitor), the nodes (Dir/node1,
	// Dir/node2), pg_autoctl's configuration (Dir/config) and the logs
	// (Dir/<name>.log). A pair made earlier in Dir is run again. Run as
	// root, the postgres OS user must be able to reach Dir (its parents
	// are never changed).
	Dir string
	// Ports of the monitor and the two nodes, on 127.0.0.1; zero picks a
	// free one.
	MonitorPort, Node1Port, Node2Port int
}

// HANodeNames are the names of the two nodes, as the monitor knows them.
var HANodeNames = [2]string{"node1", "node2"} //nolint:gochecknoglobals // read-only

// haTimings are the monitor's settings (pgautofailover.*, ms), shortened
// from pg_auto_failover's defaults (a 5 s health check, a node unhealthy
// after 20 s, 30 s for a lost primary to demote itself: about 50 s
// before the standby takes writes) so a failover takes about ten seconds
// on loopback. A node is unhealthy once its keeper has not reported for
// node_considered_unhealthy_timeout and the monitor's health check (a
// connection, health_check_timeout each, tried 1 + max_retries times) has
// failed: a node killed refuses connections at once, while a node only
// slow under load (a 2-core machine at load 10) keeps answering within
// 2 s. Under tighter settings (1 s checks, unhealthy after 3 s) such a
// load failed a healthy primary over while the whole system started.
// Lowering primary_demote_timeout is safe for data here: with synchronous
// replication the old primary commits nothing the standby did not receive
// while the standby is attached (its commits wait), and a node that comes
// back is rejoined as a standby (pg_rewind).
var haTimings = map[string]string{ //nolint:gochecknoglobals // read-only
	"pgautofailover.health_check_period":               "1000",
	"pgautofailover.health_check_timeout":              "2000",
	"pgautofailover.health_check_max_retries":          "2",
	"pgautofailover.health_check_retry_delay":          "1000",
	"pgautofailover.node_considered_unhealthy_timeout": "5000",
	"pgautofailover.primary_demote_timeout":            "3000",
	"pgautofailover.startup_grace_period":              "5000",
}

// HA is a running pg_auto_failover formation: a monitor and two
// PostgreSQL nodes, a primary and a synchronous standby
// (synchronous_standby_names 'ANY 1 (...)', set by pg_auto_failover),
// each run by its own `pg_autoctl run` keeper, a child process in its own
// process group (the keeper starts and watches its postmaster). When the
// primary's node dies, the monitor promotes the standby. Connections
// trust loopback (pg_autoctl --auth trust): a pair for tests and demos,
// not for production.
type HA struct {
	cfg  HAConfig
	bin  string
	cred *syscall.Credential
	// URL is the superuser's multi-host URL of both nodes, with
	// target_session_attrs=read-write: libpq and pgx connect to whichever
	// is the primary (PostgreSQL docs, "Connection Strings").
	URL string
	// MonitorURL is the monitor's database (pg_auto_failover).
	MonitorURL string
	// Ports of the monitor and the nodes.
	MonitorPort int
	NodePorts   [2]int

	mu    sync.Mutex
	procs map[string]*haProc // "monitor", "node1", "node2"
}

type haProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartHA starts (or, in a Dir made earlier, runs again) the monitor and
// the two nodes and waits until one node is primary and the other its
// standby. Call [HA.Stop] to stop them.
func StartHA(ctx context.Context, cfg HAConfig) (*HA, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return nil, ErrNoAutoFailover
	}
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "config"), 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	h := &HA{cfg: cfg, bin: bin, procs: map[string]*haProc{}}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		h.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := chownAll(cfg.Dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	ports := []*int{&cfg.MonitorPort, &cfg.Node1Port, &cfg.Node2Port}
	for i, p := range ports {
		if *p == 0 {
			// A pair made earlier keeps the ports it was made with.
			if old, err := os.ReadFile(filepath.Join(cfg.Dir, fmt.Sprintf("port%d", i))); err == nil {
				*p, _ = strconv.Atoi(strings.TrimSpace(string(old)))
			}
		}
		if *p == 0 {
			if *p, err = freePort(); err != nil {
				return nil, err
			}
		}
		_ = os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf("port%d", i)), []byte(strconv.Itoa(*p)), 0o644)
	}
	h.MonitorPort, h.NodePorts = cfg.MonitorPort, [2]int{cfg.Node1Port, cfg.Node2Port}
	h.MonitorURL = fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", h.MonitorPort)
	h.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write", h.NodePorts[0], h.NodePorts[1])
	ok := false
	defer func() {
		if !ok {
			_ = h.Stop()
		}
	}()

	if err := h.launch("monitor", "create", "monitor", "--pgport", strconv.Itoa(h.MonitorPort), "--listen", "127.0.0.1"); err != nil {
		return nil, err
	}
	mon := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", h.MonitorPort)
	if err := waitSQL(ctx, mon, h, "monitor", func(c *pgx.Conn) error {
		for k, v := range haTimings {
			if _, err := c.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", k, v)); err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, "SELECT pg_reload_conf()")
		return err
	}); err != nil {
		return nil, err
	}
	for i, name := range HANodeNames {
		data := filepath.Join(cfg.Dir, name)
		if i == 0 {
			if err := h.initdb(ctx, data); err != nil {
				return nil, err
			}
		}
		if err := h.launch(name, "create", "postgres", "--pgport", strconv.Itoa(h.NodePorts[i]), "--name", name,
			"--listen", "127.0.0.1", "--monitor", h.MonitorURL); err != nil {
			return nil, err
		}
		// The second node is made from the first by pg_basebackup: the
		// first must be serving first.
		if err := h.waitStates(ctx, i+1); err != nil {
			return nil, err
		}
	}
	ok = true
	return h, nil
}

// initdb makes the first node's data folder itself, with room for every
// process's pool (max_connections 300; the standby, a copy of it, gets
// the same), unless it exists; pg_autoctl then takes it over.
func (h *HA) initdb(ctx context.Context, data string) error {
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return nil
	}
	cmd := exec.CommandContext(ctx, filepath.Join(h.bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
	cmd.Dir = h.cfg.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if h.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: h.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: initdb %s: %w\n%s", data, err, out)
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString("\n# tripsaga (internal/pgcluster, StartHA)\nmax_connections = 300\nshared_buffers = 128MB\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// launch starts name's keeper: `pg_autoctl create ... --run` the first
// time, `pg_autoctl run` once its configuration exists.
func (h *HA) launch(name string, create ...string) error {
	data := filepath.Join(h.cfg.Dir, name)
	args := []string{"run", "--pgdata", data}
	if _, err := os.Stat(filepath.Join(h.cfg.Dir, "config", "pg_autoctl", strings.TrimPrefix(data, "/"), "pg_autoctl.cfg")); err != nil {
		args = append(append(create, "--pgdata", data, "--pgctl", filepath.Join(h.bin, "pg_ctl"),
			"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"), "--run")
	}
	logf, err := os.OpenFile(filepath.Join(h.cfg.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command("pg_autoctl", args...)
	cmd.Dir = h.cfg.Dir
	// pg_autoctl looks for pg_ctl on PATH and keeps its state under XDG
	// folders: both are ours, not the caller's.
	cmd.Env = []string{"PATH=" + h.bin + ":/usr/bin:/bin", "HOME=" + h.cfg.Dir, "LC_ALL=C",
		"XDG_CONFIG_HOME=" + filepath.Join(h.cfg.Dir, "config"), "XDG_DATA_HOME=" + filepath.Join(h.cfg.Dir, "config")}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM, Credential: h.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: pg_autoctl %s: %w", name, err)
	}
	p := &haProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	h.mu.Lock()
	h.procs[name] = p
	h.mu.Unlock()
	return nil
}

// waitSQL connects to url until it answers (at most 2 minutes), then runs
// f; an exit of name's keeper meanwhile is an error with its log's tail.
func waitSQL(ctx context.Context, url string, h *HA, name string, f func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			err = f(c)
			c.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		if !h.Running(name) {
			return fmt.Errorf("pgcluster: pg_autoctl %s exited: %s", name, h.logTail(name))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: %s never answered: %w (%s)", name, err, h.logTail(name))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitStates waits until n nodes are registered and settled: with one,
// it is single; with two, one is primary (synchronous_standby_names set)
// and the other secondary.
func (h *HA) waitStates(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		st, err := h.States(ctx)
		if err == nil {
			var prim, sec int
			for _, s := range st {
				if s.Reported == s.Assigned {
					switch {
					case s.Reported == "single" && n == 1, s.Reported == "primary" && n == 2:
						prim++ // with a standby, "primary" once replication is synchronous
					case s.Reported == "secondary":
						sec++
					}
				}
			}
			if len(st) == n && prim == 1 && sec == n-1 {
				return nil
			}
		}
		for _, name := range HANodeNames[:n] {
			if !h.Running(name) {
				return fmt.Errorf("pgcluster: pg_autoctl %s exited: %s", name, h.logTail(name))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: the pair never settled (%v, %v): %s", st, err, h.logTail(HANodeNames[n-1]))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// NodeState is a node as the monitor sees it.
type NodeState struct {
	Name, Reported, Assigned string
	Port                     int
}

// States returns the monitor's view of the nodes (pgautofailover.node),
// in node id order.
func (h *HA) States(ctx context.Context) ([]NodeState, error) {
	c, err := pgx.Connect(ctx, h.MonitorURL)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	rows, err := c.Query(ctx, "SELECT nodename, nodeport, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := r.Scan(&s.Name, &s.Port, &s.Reported, &s.Assigned)
		return s, err
	})
}

// Primary returns the node the monitor has assigned the primary's role
// (primary, wait_primary or single), or "" when none has it now.
func (h *HA) Primary(ctx context.Context) (string, error) {
	st, err := h.States(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range st {
		if s.Assigned == "primary" || s.Assigned == "wait_primary" || s.Assigned == "single" {
			return s.Name, nil
		}
	}
	return "", nil
}

// Running reports whether name's keeper ("monitor", "node1", "node2")
// runs.
func (h *HA) Running(name string) bool {
	h.mu.Lock()
	p := h.procs[name]
	h.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill kills name's node with SIGKILL, keeper, postmaster and the
// postmaster's children (backends, walsenders) at once, as a machine
// that dies: a backend left alone would go on serving its client, and
// committing, until it noticed its postmaster's death. It waits for the
// keeper. A postmaster killed alone is only restarted by its keeper, on
// the same node.
func (h *HA) Kill(name string) error {
	h.mu.Lock()
	p := h.procs[name]
	h.mu.Unlock()
	if p == nil {
		return fmt.Errorf("pgcluster: no node %q", name)
	}
	pm, _ := postmasterPid(filepath.Join(h.cfg.Dir, name))
	var kids []int
	if pm > 0 {
		// Stopped, it forks no backend while its children are listed.
		_ = syscall.Kill(pm, syscall.SIGSTOP)
		kids = childrenOf(pm)
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	if pm > 0 {
		_ = syscall.Kill(pm, syscall.SIGKILL)
	}
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	<-p.done
	return nil
}

// childrenOf returns the pids whose parent is pid (from /proc/<pid>/stat,
// proc(5): the fourth field, after the command in parentheses).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// Restart runs name's keeper again (`pg_autoctl run`) after it died: a
// node that was primary rejoins as the new primary's standby.
func (h *HA) Restart(name string) error {
	if h.Running(name) {
		return nil
	}
	return h.launch(name)
}

// Stop stops the nodes and then the monitor (SIGTERM to each keeper, which
// stops its postmaster; SIGKILL to the group after 30 s).
func (h *HA) Stop() error {
	for _, name := range []string{"node2", "node1", "monitor"} {
		h.mu.Lock()
		p := h.procs[name]
		h.mu.Unlock()
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	return nil
}

func (h *HA) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(h.cfg.Dir, name+".log"))
	return tail(string(b), 1500)
}

// WaitPair waits (at most 3 minutes) until both nodes are settled in
// their roles: one reported and assigned primary (replication
// synchronous again), the other secondary. After a failover that is once
// the old primary, run again, has rejoined as the new primary's standby.
func (h *HA) WaitPair(ctx context.Context) error { return h.waitStates(ctx, 2) }

// Failover is what one [HA.FailOver] did. Durations are from the kill.
type Failover struct {
	// Killed was the primary; Promoted is the standby that replaced it.
	Killed, Promoted string
	// At is when the SIGKILL was sent.
	At time.Time
	// Writable: the first write (a transaction that took an xid and
	// committed) through [HA.URL] after the kill.
	Writable time.Duration
	// Rejoined: the killed node, run again, is the new primary's
	// synchronous standby (see [HA.WaitPair]).
	Rejoined time.Duration
}

// FailOver waits until the pair is whole ([HA.WaitPair]), kills the
// primary's node with SIGKILL (see [HA.Kill]), waits
// until a write commits through the multi-host URL (the monitor has
// promoted the standby: pg_auto_failover's failover), then runs the
// killed node's keeper again and waits until it has rejoined as the new
// primary's standby (pg_rewind by pg_autoctl), so the pair can fail over
// again. Each wait is bounded by ctx and by 3 minutes; the error names
// the phase that did not end.
func (h *HA) FailOver(ctx context.Context) (Failover, error) {
	var f Failover
	// A pair not whole (its standby still catching up, as after a
	// failover the monitor made on its own) has no standby to promote.
	if err := h.WaitPair(ctx); err != nil {
		return f, fmt.Errorf("pgcluster: the pair is not whole before the failover: %w", err)
	}
	first, err := h.Primary(ctx)
	if err != nil {
		return f, fmt.Errorf("pgcluster: the monitor: %w", err)
	}
	if first == "" {
		return f, errors.New("pgcluster: no node is primary now: nothing to fail over")
	}
	f.Killed, f.At = first, time.Now()
	if err := h.Kill(first); err != nil {
		return f, err
	}
	killed := f.At
	if err := h.waitWritable(ctx); err != nil {
		st, serr := h.States(context.WithoutCancel(ctx))
		return f, fmt.Errorf("pgcluster: after killing %s: %w (monitor: %v %v; log of the other node: %s)", first, err, st, serr, h.logTail(h.other(first)))
	}
	f.Writable = time.Since(killed)
	if f.Promoted, err = h.Primary(ctx); err != nil {
		return f, fmt.Errorf("pgcluster: the monitor: %w", err)
	}
	if err := h.Restart(first); err != nil {
		return f, err
	}
	if err := h.WaitPair(ctx); err != nil {
		return f, fmt.Errorf("pgcluster: %s rejoining as standby: %w", first, err)
	}
	f.Rejoined = time.Since(killed)
	return f, nil
}

// waitWritable waits (at most 3 minutes) until a transaction that takes
// an xid commits through h.URL: on a standby, txid_current fails
// ("cannot assign TransactionIds during recovery"), and with synchronous
// replication on, the commit waits for a standby.
func (h *HA) waitWritable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.Connect(cctx, h.URL)
		if err == nil {
			_, err = c.Exec(cctx, "SELECT txid_current()")
			c.Close(context.Background())
		}
		ccancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("never writable again: %w", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// other names the node that is not name.
func (h *HA) other(name string) string {
	if name == HANodeNames[0] {
		return HANodeNames[1]
	}
	return HANodeNames[0]
}
