package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PgBouncer starts a real PgBouncer (the machine's pgbouncer, Debian's
// package) in pool mode mode ("session", "transaction" or "statement")
// in front of the server dbURL names, listening on 127.0.0.1 only. Each
// URL in through gives its user and password to the pooler's auth file
// (scram-sha-256 for clients; the pooler logs in to PostgreSQL with the
// same password). extra lines are added to its [pgbouncer] section (e.g.
// "ignore_startup_parameters = search_path"). It returns a function that
// rewrites a URL of that server to go through the pooler. The test is
// skipped when pgbouncer is not installed (.ci/run installs it). Run as
// root, pgbouncer (which refuses root) runs as the postgres OS user. It is
// killed when the test ends.
func PgBouncer(tb testing.TB, dbURL, mode string, through []string, extra ...string) func(string) string {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin = "/usr/sbin/pgbouncer"; !exists(bin) {
			tb.Skip("testenv: pgbouncer is not installed (apt-get install pgbouncer)")
		}
	}
	backend, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("testenv: pgbouncer: %v", err)
	}
	dir, err := os.MkdirTemp("", "tripsaga-pgbouncer-")
	if err != nil {
		tb.Fatalf("testenv: pgbouncer: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	var users strings.Builder
	for _, u := range through {
		pu, err := url.Parse(u)
		if err != nil {
			tb.Fatalf("testenv: pgbouncer: %v", err)
		}
		pw, _ := pu.User.Password()
		fmt.Fprintf(&users, "%q %q\n", pu.User.Username(), pw)
	}
	port := freePort(tb)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
max_client_conn = 500
default_pool_size = 40
logfile = %s
%s
`, backend.Hostname(), backend.Port(), port, filepath.Join(dir, "users.txt"), mode, filepath.Join(dir, "pgbouncer.log"), strings.Join(extra, "\n"))
	for name, body := range map[string]string{"users.txt": users.String(), "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			tb.Fatalf("testenv: pgbouncer: %v", err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("testenv: pgbouncer as root needs the postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		if err := chownTree(dir, uid, gid); err != nil {
			tb.Fatalf("testenv: pgbouncer: %v", err)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testenv: pgbouncer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited //nolint:errcheck // killed: its error says so
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil { //nolint:noctx // a bounded poll (1 s per dial, 30 s in all)
			_ = c.Close()
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("testenv: pgbouncer exited: %v\n%s", err, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: pgbouncer never listened on %s", addr)
		}
	}
	return func(u string) string {
		pu, err := url.Parse(u)
		if err != nil {
			tb.Fatalf("testenv: pgbouncer: %v", err)
		}
		pu.Host = addr
		return pu.String()
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
