package stack

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockFile is the file in a stack's folder that a running stack holds an
// open-file-description write lock on (fcntl F_OFD_SETLK) for its whole
// life. The kernel releases it when the process ends, however it ends
// (even SIGKILL), so a stale file never blocks. It holds the holder's pid.
const LockFile = ".lock"

// ErrDirInUse is returned by [Start] when another process (a `tripsaga up`
// or `demo`) holds the folder's lock.
var ErrDirInUse = errors.New("stack: folder in use")

// lockDir takes dir's lock without waiting and writes our pid into it. The
// lock lives as long as the returned file stays open. When another process
// holds it, the error wraps [ErrDirInUse] and names that process.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("stack: lock: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, inUse(dir)
		}
		return nil, fmt.Errorf("stack: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

func inUse(dir string) error {
	who := "another process"
	if pid := holderPid(dir); pid > 0 {
		who = "process " + strconv.Itoa(pid)
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(b) > 0 {
			who += " (" + strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) + ")"
		}
	}
	return fmt.Errorf("%w: %s is used by %s, which holds %s; stop it first, or give this one another folder (--dir)",
		ErrDirInUse, dir, who, filepath.Join(dir, LockFile))
}

func holderPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Running reports whether a stack (a `tripsaga up` or `demo`) runs in
// dir, that is whether some process holds dir's [LockFile], and that
// process's pid (0 if unknown). It only looks: it never takes the lock. A
// folder without a lock file is not running, without error.
func Running(dir string) (pid int, running bool, err error) {
	f, err := os.Open(filepath.Join(dir, LockFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("stack: %w", err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return 0, false, fmt.Errorf("stack: lock %s: %w", f.Name(), err)
	}
	if lk.Type == unix.F_UNLCK {
		return 0, false, nil
	}
	return holderPid(dir), true, nil
}
