package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/process"
)

// defaultUpDir is `tripsaga up`'s default --dir.
const defaultUpDir = ".tripsaga"

// errNoUp is wrapped by [envFromUpDir] when no `tripsaga up` runs in the
// folder.
var errNoUp = errors.New("no tripsaga up runs there")

// envFromUpDir returns the environment of the `tripsaga up` (or `demo`)
// running in dir, read from the dir/up.env it wrote: NATS_URL,
// DATABASE_URL, HOTEL_URL, PAYMENTS_URL, CARS_URL, MAIL_URL, TRIPS_URL
// and RECONCILER_URL, as URLs. Errors wrap [errNoUp] when nothing holds
// dir's lock (the file, if any, is from a run that ended), or are those of
// reading the file.
func envFromUpDir(dir string) (map[string]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	_, running, err := stack.Running(abs)
	if err != nil {
		return nil, err
	}
	if !running {
		return nil, fmt.Errorf("%s: %w (start one with: tripsaga up --dir %s)", abs, errNoUp, dir)
	}
	env, err := stack.ReadEnvFile(abs)
	if err != nil {
		return nil, fmt.Errorf("the tripsaga up in %s: %w", abs, err)
	}
	return env, nil
}

// envForTool is the environment of a command that uses a running system
// (replay, outbox) and needs the variables named in need: with dir set,
// the `tripsaga up` running there (its values win); otherwise the process
// environment, and when that lacks one of need, a `tripsaga up` running in
// the default folder. Errors say which variables are missing and how to
// point at a running up.
func envForTool(dir string, need ...string) (process.Env, error) {
	if dir == "" && slices.ContainsFunc(need, func(k string) bool { return os.Getenv(k) == "" }) {
		if _, running, _ := stack.Running(defaultUpDir); running {
			dir = defaultUpDir
		}
	}
	if dir != "" {
		vars, err := envFromUpDir(dir)
		if err != nil {
			return process.Env{}, err
		}
		for k, v := range vars {
			if err := os.Setenv(k, v); err != nil {
				return process.Env{}, err
			}
		}
	}
	env, err := process.EnvFromOS()
	if err != nil {
		return env, err
	}
	if err := env.Require(need...); err != nil {
		if stale := staleUp(defaultUpDir); stale != "" {
			return env, fmt.Errorf("%w: %s", err, stale)
		}
		return env, fmt.Errorf("%w\n(set them as `tripsaga up` prints them, or name the folder of a running up with --dir)", err)
	}
	return env, nil
}

// staleUp says, when dir holds the up.env of a `tripsaga up` that is no
// longer running (it was killed, so it could not remove the file), that
// this up is not running and how to start it again; else "". A tool
// missing a variable then names the real cause instead of only the
// variable.
func staleUp(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, stack.EnvFile)); err != nil {
		return ""
	}
	if _, running, err := stack.Running(dir); err != nil || running {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return fmt.Sprintf("the tripsaga up that wrote %s is not running (it stopped without removing the file, as when killed): start it again with `tripsaga up --dir %s`, or set the variables of another system", filepath.Join(abs, stack.EnvFile), dir)
}
