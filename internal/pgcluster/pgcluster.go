// Package pgcluster starts a private PostgreSQL cluster in a folder, made
// with the machine's own initdb and pg_ctl. The demo runner and the tests use
// it so that nothing depends on a system PostgreSQL.
//
// PostgreSQL refuses to run as root. When the effective uid is 0 the
// binaries run as the "postgres" OS user, and the folder is handed to it;
// when postgres cannot reach the folder, the cluster lives in a folder made
// for it instead, under [RootHome] or, for a folder in the temp folder, in
// the temp folder (see [Start]).
package pgcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// ClockOffset, when not zero, runs the server with its clock that far
	// ahead (positive) or behind (negative) of the machine's, by
	// libfaketime ([FaketimeLibrary], LD_PRELOAD with FAKETIME="+10s"):
	// now(), clock_timestamp() and every timestamp the server writes move
	// by it, and the clock runs at its normal rate. For tests of a
	// database whose clock disagrees with the services' hosts. Whole
	// milliseconds; Start fails with [ErrNoFaketime] when the library is
	// not installed. A running server that is adopted keeps its clock.
	ClockOffset time.Duration
}

// FaketimeLibrary is libfaketime's preload library as Debian's libfaketime
// package installs it (apt-get install faketime).
const FaketimeLibrary = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

// ErrNoFaketime is returned by [Start] for a Config.ClockOffset when
// [FaketimeLibrary] is missing.
var ErrNoFaketime = errors.New("pgcluster: ClockOffset needs libfaketime (" + FaketimeLibrary + "): apt-get install faketime")

// HasFaketime reports whether [FaketimeLibrary] is installed, so a
// Config.ClockOffset can be honoured.
func HasFaketime() bool {
	_, err := os.Stat(FaketimeLibrary)
	return err == nil
}

// faketimeEnv is the environment that runs a program with its clock off
// by offset: FAKETIME's relative form "+10.5s"/"-3s" (libfaketime's README,
// "Relative date offsets"). FAKETIME_DONT_FAKE_MONOTONIC keeps
// CLOCK_MONOTONIC true, so timeouts and statistics measured with it stay
// right. The postmaster's children (every backend) inherit it.
func faketimeEnv(offset time.Duration) []string {
	ms := offset.Milliseconds()
	sign := "+"
	if ms < 0 {
		sign, ms = "-", -ms
	}
	return []string{
		"LD_PRELOAD=" + FaketimeLibrary,
		fmt.Sprintf("FAKETIME=%s%d.%03ds", sign, ms/1000, ms%1000),
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// RootHome holds, when Start runs as root and the postgres OS user cannot
// reach Config.Dir (a parent folder denies it search permission), one
// folder per such cluster: owned by postgres, mode 0700, linked from
// Config.Dir/data (and Config.Dir/postgres.log), with the link's path in
// its file "linked-from". Removing Config.Dir leaves that folder behind.
//
// A Config.Dir inside [os.TempDir] is temporary: its cluster's folder is
// made in os.TempDir() instead, named [TempHomePrefix]*, and removed by a
// later Start as root once its link is gone and its server stopped.
const RootHome = "/var/lib/tripsaga/postgres"

// TempHomePrefix starts the name of a cluster folder made in os.TempDir()
// (see [RootHome]).
const TempHomePrefix = "tripsaga-pg-home-"

// ErrUnreachable is returned by [Start], run as root, when the postgres OS
// user cannot reach the cluster's folder and no folder made for it can be
// used. Start never changes the modes of folders above Config.Dir.
var ErrUnreachable = errors.New("pgcluster: the postgres OS user cannot reach the cluster's folder (a parent folder denies it search permission, and tripsaga does not change the modes of folders it was not given)")

// Cluster is a running private PostgreSQL server.
type Cluster struct {
	cfg  Config
	bin  string
	cred *syscall.Credential
	home string // holds data/, postgres.log and the socket: Config.Dir or a folder under RootHome
	pid  int
	Port int
	// URL is a libpq URL for the "postgres" database, as superuser
	// postgres with its password (see [PasswordFile]).
	URL string
	// Password is the superuser's password, also in URL.
	Password string
	// DataDir is the cluster's data folder: Config.Dir/data, or, run as
	// root when postgres cannot reach Config.Dir, a folder under
	// [RootHome] that Config.Dir/data links to.
	DataDir string
	// Adopted is true when Start found a server already running on the
	// cluster (its runner was killed without stopping it) and used it
	// instead of starting one.
	Adopted bool
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
// accepts connections. A server already running on the cluster (its runner
// was killed) is adopted instead: [Cluster.Adopted] says so. Call
// [Cluster.Stop] to shut it down.
//
// Run as root, Start never changes the modes of Dir's parents: when the
// postgres OS user can reach Dir, the cluster lives there (Dir is handed
// to postgres); otherwise it lives in a new folder made for postgres under
// [RootHome] (or in the temp folder, for a Dir inside it), linked from
// Dir/data and Dir/postgres.log. If postgres cannot reach a cluster made
// in place earlier, Start fails with an error wrapping [ErrUnreachable].
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		return nil, errors.New("pgcluster: Config.Dir is required")
	}
	if cfg.ClockOffset != 0 && !HasFaketime() {
		return nil, ErrNoFaketime
	}
	if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{cfg: cfg, bin: bin, home: cfg.Dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := c.placeForPostgres(ctx, uid, gid); err != nil {
			return nil, err
		}
	}
	c.DataDir = filepath.Join(c.home, "data")
	data := c.DataDir
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		if err := os.MkdirAll(data, 0o700); err != nil {
			return nil, err
		}
		if c.cred != nil {
			_ = os.Chown(data, int(c.cred.Uid), int(c.cred.Gid))
		}
		// The superuser's password is set by initdb (--pwfile) and every
		// connection, TCP or socket, must give a role's password
		// (scram-sha-256): a role cannot log in as another.
		pwFile, err := c.newPassword()
		if err != nil {
			return nil, err
		}
		args := []string{"-D", data, "-U", "postgres", "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--pwfile=" + pwFile, "-E", "UTF8", "--locale=C"}
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
		c.Adopted = true
		c.pid, _ = c.readPid()
		if err := c.ensureAuth(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	port := cfg.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	c.Port = port
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	if err := c.ensureAuth(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// PasswordFile is the file, in the cluster's folder (beside data/), that
// holds the superuser postgres's password (mode 0600).
const PasswordFile = "superuser.password"

// hba is the cluster's pg_hba.conf: a password (scram-sha-256) for every
// role, on the socket and over TCP.
const hba = `# tripsaga (internal/pgcluster): every connection gives its role's password.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
`

// newPassword writes a new superuser password to [PasswordFile] and
// returns the file's path.
func (c *Cluster) newPassword() (string, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	path := filepath.Join(c.home, PasswordFile)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil { // initdb, run as postgres, reads it
		if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return "", fmt.Errorf("pgcluster: %w", err)
		}
	}
	return path, nil
}

// ensureAuth sets c.URL with the superuser's password. A cluster made by
// an earlier version (no [PasswordFile], pg_hba "trust") is given a
// password first, over its still trusting TCP, then its pg_hba.conf is
// replaced by [hba] and the server reloads it.
func (c *Cluster) ensureAuth(ctx context.Context) error {
	path := filepath.Join(c.home, PasswordFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := c.newPassword(); err != nil {
			return err
		}
		if b, err = os.ReadFile(path); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port))
		if err != nil {
			return fmt.Errorf("pgcluster: giving the superuser of a cluster made by an earlier version a password: %w", err)
		}
		_, err = conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+strings.TrimSpace(string(b))+"'")
		conn.Close(context.Background())
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				err = errors.New(pe.Message) // the statement holds the password
			}
			return fmt.Errorf("pgcluster: setting the superuser's password: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	pw := strings.TrimSpace(string(b))
	hbaPath := filepath.Join(c.DataDir, "pg_hba.conf")
	if cur, err := os.ReadFile(hbaPath); err != nil || string(cur) != hba {
		if err := os.WriteFile(hbaPath, []byte(hba), 0o600); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if c.cred != nil {
			_ = os.Chown(hbaPath, int(c.cred.Uid), int(c.cred.Gid))
		}
		if out, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "reload"); err != nil {
			return fmt.Errorf("pgcluster: pg_ctl reload: %w\n%s", err, out)
		}
	}
	c.Password = pw
	c.URL = (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", pw), Host: fmt.Sprintf("127.0.0.1:%d", c.Port), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	return nil
}

// start runs pg_ctl start on c.Port and records the postmaster's pid.
func (c *Cluster) start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c max_connections=300 -c shared_buffers=128MB", c.Port, c.home)
	if !c.cfg.Durable {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	extra, err := settingOptions(c.cfg.Settings)
	if err != nil {
		return err
	}
	opts += extra
	logFile := filepath.Join(c.home, "postgres.log")
	var env []string
	if c.cfg.ClockOffset != 0 {
		env = faketimeEnv(c.cfg.ClockOffset)
	}
	if out, err := c.runEnv(ctx, env, "pg_ctl", "-D", c.DataDir, "-l", logFile, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\n%s", err, out, tail(string(log), 2000))
	}
	pid, err := c.readPid()
	if err != nil {
		return err
	}
	c.pid = pid
	return nil
}

// Restart starts the server again on the same port after it died (say,
// the postmaster was killed with SIGKILL), and waits until it accepts
// connections. A server that still runs is left alone. Errors are those of
// pg_ctl start, with the tail of the server's log; PostgreSQL may refuse
// to start while the dead server's backends are still exiting, so callers
// retry.
func (c *Cluster) Restart(ctx context.Context) error {
	if c.Alive() {
		return nil
	}
	return c.start(ctx)
}

// Pid returns the postmaster's process id, as recorded when the server was
// started or adopted.
func (c *Cluster) Pid() int { return c.pid }

// Alive reports whether the postmaster recorded by [Cluster.Pid] still
// runs; a killed postmaster that no one has reaped yet (a zombie) is dead.
func (c *Cluster) Alive() bool { return processAlive(c.pid) }

// processAlive reports whether pid names a live process that is not a
// zombie.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// readPid reads the postmaster's pid from line 1 of postmaster.pid.
func (c *Cluster) readPid() (int, error) { return postmasterPid(c.DataDir) }

// postmasterPid reads the pid on line 1 of data/postmaster.pid.
func postmasterPid(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: postmaster.pid: %w", err)
	}
	return pid, nil
}

// Stop shuts the server down (fast mode) and waits for it.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return c.runEnv(ctx, nil, name, args...)
}

// runEnv is run with env added to the program's environment.
func (c *Cluster) runEnv(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.home
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
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
	// pg_ctl status counts a killed postmaster no one reaped (a zombie)
	// as running.
	if pid, err := c.readPid(); err != nil || !processAlive(pid) {
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

// placeForPostgres decides where the cluster lives when the binaries run
// as the postgres OS user (uid, gid): in Dir when postgres can reach it,
// else in a new folder under [RootHome] linked from Dir. It never changes
// the mode of a folder above Dir.
func (c *Cluster) placeForPostgres(ctx context.Context, uid, gid int) error {
	sweepTempHomes(os.TempDir(), uid)
	link := filepath.Join(c.cfg.Dir, "data")
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(link)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		home := filepath.Dir(target)
		if _, err := os.Stat(home); err == nil {
			if !c.reachable(ctx, home) {
				return fmt.Errorf("%w: %s (linked from %s)", ErrUnreachable, home, link)
			}
			c.home = home
			return nil
		}
		// The folder the link names is gone: make a new one.
		if err := os.Remove(link); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if err := chownAll(c.cfg.Dir, uid, gid); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.reachable(ctx, c.cfg.Dir) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(link, "PG_VERSION")); err == nil {
		return fmt.Errorf("%w: the cluster in %s was made there earlier; move the folder somewhere postgres can reach, or grant search permission on its parents yourself (chmod o+x)", ErrUnreachable, link)
	}
	base, prefix := RootHome, homeName(c.cfg.Dir)+"-"
	if tmp := os.TempDir(); strings.HasPrefix(c.cfg.Dir, filepath.Clean(tmp)+string(filepath.Separator)) {
		base, prefix = tmp, TempHomePrefix
	} else if err := os.MkdirAll(RootHome, 0o755); err != nil {
		return fmt.Errorf("pgcluster: a folder for the postgres user: %w", err)
	}
	home, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return fmt.Errorf("pgcluster: a folder for the postgres user: %w", err)
	}
	if err := os.Chown(home, uid, gid); err != nil {
		_ = os.RemoveAll(home)
		return fmt.Errorf("pgcluster: %w", err)
	}
	if !c.reachable(ctx, home) {
		_ = os.RemoveAll(home)
		return fmt.Errorf("%w: neither %s nor %s", ErrUnreachable, c.cfg.Dir, home)
	}
	if err := os.Symlink(filepath.Join(home, "data"), link); err != nil {
		_ = os.RemoveAll(home)
		return fmt.Errorf("pgcluster: %w", err)
	}
	logLink := filepath.Join(c.cfg.Dir, "postgres.log")
	_ = os.Remove(logLink)
	_ = os.Symlink(filepath.Join(home, "postgres.log"), logLink)
	pwLink := filepath.Join(c.cfg.Dir, PasswordFile) // written later, in home
	_ = os.Remove(pwLink)
	_ = os.Symlink(filepath.Join(home, PasswordFile), pwLink)
	// Written after the link, so a sweep never sees a record without it.
	if err := os.WriteFile(filepath.Join(home, "linked-from"), []byte(link+"\n"), 0o644); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.home = home
	return nil
}

// sweepTempHomes removes the cluster folders [TempHomePrefix]* in base
// owned by uid (postgres) whose link (named in their "linked-from") is
// gone, that is whose temporary Config.Dir was removed, and whose server
// does not run.
func sweepTempHomes(base string, uid int) {
	homes, _ := filepath.Glob(filepath.Join(base, TempHomePrefix+"*"))
	for _, home := range homes {
		fi, err := os.Lstat(home)
		if err != nil || !fi.IsDir() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid {
			continue
		}
		b, err := os.ReadFile(filepath.Join(home, "linked-from"))
		if err != nil {
			continue // being made, or not ours
		}
		link := strings.TrimSpace(string(b))
		if target, err := os.Readlink(link); err == nil && filepath.Dir(target) == home {
			continue
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if pid, err := postmasterPid(filepath.Join(home, "data")); err == nil && processAlive(pid) {
			continue
		}
		_ = os.RemoveAll(home)
	}
}

// reachable reports whether the postgres OS user can enter dir: it runs
// "pg_ctl --version" as postgres in dir, which fails if any parent folder
// denies postgres search permission (modes, groups and ACLs alike).
func (c *Cluster) reachable(ctx context.Context, dir string) bool {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_ctl"), "--version")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	return cmd.Run() == nil
}

// homeName is a readable prefix for a cluster's folder under [RootHome]:
// the name of the folder above dir (the runner's folder, e.g. "x" for
// x/pg), reduced to letters, digits, '.', '_' and '-'.
func homeName(dir string) string {
	name := []byte(filepath.Base(filepath.Dir(dir)))
	for i, b := range name {
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			name[i] = '_'
		}
	}
	if len(name) > 40 {
		name = name[:40]
	}
	return strings.TrimLeft(string(name), ".")
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

// StopLeftBehind stops, at once (SIGQUIT: immediate shutdown, crash
// recovery at its next start), the server of a cluster folder (a
// Config.Dir) whose owner is gone, such as one a test binary killed with
// SIGKILL left running, and waits (at most 30 s) until it has exited. It
// reports whether a server was running; none is not an error.
func StopLeftBehind(dir string) (bool, error) {
	pid, err := postmasterPid(filepath.Join(dir, "data"))
	if err != nil || !processAlive(pid) {
		return false, nil //nolint:nilerr // no pid file, or no server: nothing to stop
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return true, fmt.Errorf("pgcluster: stop the server left in %s (pid %d): %w", dir, pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); processAlive(pid); {
		if time.Now().After(deadline) {
			return true, fmt.Errorf("pgcluster: the server left in %s (pid %d) did not exit within 30 s of SIGQUIT", dir, pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true, nil
}

// ProcessAlive reports whether pid names a live process that is not a
// zombie.
func ProcessAlive(pid int) bool { return processAlive(pid) }
