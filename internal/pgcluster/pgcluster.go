// Package pgcluster starts a private PostgreSQL cluster in a folder, made
// with the machine's own initdb and pg_ctl. The demo runner and the tests use
// it so that nothing depends on a system PostgreSQL.
//
// PostgreSQL refuses to run as root. When the effective uid is 0 the
// binaries run as the "postgres" OS user, and the folder is handed to it.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoBinaries is returned by [Start] when initdb or pg_ctl cannot be found
// on PATH nor under /usr/lib/postgresql/*/bin.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl) not found; install PostgreSQL (e.g. apt-get install postgresql) or set DATABASE_URL")

// Config says where and how to run the cluster.
type Config struct {
	// Dir holds the cluster (Dir/data) and its log (Dir/postgres.log).
	// An existing cluster in Dir is reused.
	Dir string
	// Port to listen on at 127.0.0.1. Zero picks a free port.
	Port int
	// Durable keeps fsync on. Tests leave it off for speed.
	Durable bool
	// Settings are extra server settings, each passed as "-c name=value"
	// when the server is started (not when a running one is adopted), e.g.
	// {"shared_preload_libraries": "pg_stat_statements"}. Values hold no
	// quote characters.
	Settings map[string]string
}

// Cluster is a running private PostgreSQL server.
type Cluster struct {
	cfg  Config
	bin  string
	cred *syscall.Credential
	Port int
	// URL is a libpq URL for the "postgres" database, as superuser postgres.
	URL string
}

// FindBinaries returns the folder holding initdb and pg_ctl, or [ErrNoBinaries].
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	sort.Strings(matches)
	for i := len(matches) - 1; i >= 0; i-- {
		dir := filepath.Dir(matches[i])
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

// Start makes the cluster if Dir holds none, starts it and waits until it
// accepts connections. Call [Cluster.Stop] to shut it down.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		return nil, errors.New("pgcluster: Config.Dir is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{cfg: cfg, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := chownAll(cfg.Dir, uid, gid); err != nil {
			return nil, err
		}
		if err := allowTraverse(cfg.Dir); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(cfg.Dir, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		if err := os.MkdirAll(data, 0o700); err != nil {
			return nil, err
		}
		if c.cred != nil {
			_ = os.Chown(data, int(c.cred.Uid), int(c.cred.Gid))
		}
		args := []string{"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"}
		if !cfg.Durable {
			args = append(args, "--no-sync")
		}
		if out, err := c.run(ctx, "initdb", args...); err != nil {
			return nil, fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
		}
	}
	// A cluster left running (its runner was killed) is adopted, not
	// started twice.
	if p, ok := c.running(ctx, data); ok {
		c.Port = p
		c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p)
		return c, nil
	}
	port := cfg.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	c.Port = port
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c max_connections=300 -c shared_buffers=128MB", port, cfg.Dir)
	if !cfg.Durable {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	extra, err := settingOptions(cfg.Settings)
	if err != nil {
		return nil, err
	}
	opts += extra
	logFile := filepath.Join(cfg.Dir, "postgres.log")
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", logFile, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(logFile)
		return nil, fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\n%s", err, out, tail(string(log), 2000))
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return c, nil
}

// Stop shuts the server down (fast mode) and waits for it.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.cfg.Dir, "data"), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.cfg.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// pg_ctl start leaves the postmaster running with our stdout otherwise.
	out, err := cmd.CombinedOutput()
	return out, err
}

// running reports whether a server runs on data, and its port (line 4 of
// postmaster.pid).
func (c *Cluster) running(ctx context.Context, data string) (int, bool) {
	if _, err := c.run(ctx, "pg_ctl", "-D", data, "status"); err != nil {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, false
	}
	p, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	return p, err == nil
}

// settingOptions renders Settings as " -c 'name=value'" options in name
// order; pg_ctl hands them to a shell, hence the quotes.
func settingOptions(settings map[string]string) (string, error) {
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		v := settings[k]
		if k == "" || strings.ContainsAny(k+v, "'\"\\\n") || strings.ContainsAny(k, " =") {
			return "", fmt.Errorf("pgcluster: setting %q=%q: want a plain name and a value without quotes", k, v)
		}
		fmt.Fprintf(&b, " -c '%s=%s'", k, v)
	}
	return b.String(), nil
}

func chownAll(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// allowTraverse adds o+x (search, not read) to every ancestor of dir that
// lacks it, so the postgres OS user can reach its cluster folder even under
// a 0700 home such as /root.
func allowTraverse(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pgcluster: the postgres user cannot reach %s: %w", dir, err)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
