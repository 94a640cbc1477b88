package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/tripsaga/tripsaga/internal/bench"
)

// TestBenchRefusesBadFlags: a --trips-url without a scheme, a negative trip
// count and zero clients are refused with a clear error before anything
// starts, instead of a nil-pointer panic or a run that books nothing
// (issue 7, item 13).
func TestBenchRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trips-url", "127.0.0.1:7405"}, "http://"},
		{[]string{"--trips-url", "localhost:7405"}, "http://"},
		{[]string{"--trips-url", "http://"}, "host"},
		{[]string{"--trips", "-5"}, "--trips -5"},
		{[]string{"--trips", "0", "--trips-url", "http://127.0.0.1:1"}, "--trips 0"},
		{[]string{"--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--concurrency", "8,0", "--trips-url", "http://127.0.0.1:1"}, "--concurrency 0"},
		{[]string{"--open", "150"}, "--open 150"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := benchCmd()
			var out, errb bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&errb)
			cmd.SetArgs(tc.args)
			cmd.SilenceUsage = true
			err := cmd.ExecuteContext(context.Background())
			if err == nil {
				t.Fatalf("accepted; stdout %q", out.String())
			}
			if !errors.Is(err, bench.ErrBadFlag) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want one wrapping bench.ErrBadFlag and naming %q", err, tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("printed a report: %q", out.String())
			}
		})
	}
}

// TestBenchProgressOnlyOnTerminal: the progress bar is drawn only when
// stderr is a terminal; into a file or a buffer it would be a line per
// update.
func TestBenchProgressOnlyOnTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if w := progressWriter(f); w != nil {
		t.Error("progress bar drawn into a file")
	}
	if w := progressWriter(&bytes.Buffer{}); w != nil {
		t.Error("progress bar drawn into a buffer")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if pw := progressWriter(w); pw != nil {
		t.Error("progress bar drawn into a pipe")
	}
}
