package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBadStepsRefusedWithOneLine (issue 19 item 2): a STEPS the catalogue
// cannot build ended every command, --help included, in a Go panic with
// a stack trace (events.Selected called while building the commands).
// Now --help works, and any command is refused before it runs with one
// line naming STEPS and why, exit code 2.
func TestBadStepsRefusedWithOneLine(t *testing.T) {
	bin := buildTripsaga(t)
	runWith := func(steps string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(withoutStackEnv(), "STEPS="+steps)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return o.String(), e.String(), exit.ExitCode()
		}
		require.NoError(t, err)
		return o.String(), e.String(), 0
	}
	for _, help := range [][]string{{"--help"}, {"serve", "--help"}, {"outbox", "list", "--help"}, {"replay", "--help"}} {
		out, errOut, code := runWith("bogus", help...)
		require.Equal(t, 0, code, "%v: %s", help, errOut)
		require.Contains(t, out, "Usage:", "%v", help)
		require.NotContains(t, errOut, "panic", "%v", help)
	}
	for steps, why := range map[string]string{
		"bogus":                       `unknown step "bogus"`,
		"hotel,hotel,car":             "step hotel named twice",
		"hotel,payment,car,insurance": "compensable step insurance comes after the pivot car",
	} {
		for _, args := range [][]string{{"serve", "trips"}, {"up", "--dir", t.TempDir()}, {"replay"}} {
			_, errOut, code := runWith(steps, args...)
			require.Equal(t, 2, code, "STEPS=%s %v: %s", steps, args, errOut)
			require.NotContains(t, errOut, "goroutine", "no stack trace")
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			require.Len(t, lines, 1, "one line: %s", errOut)
			require.Contains(t, lines[0], "STEPS="+steps)
			require.Contains(t, lines[0], why)
		}
	}
}

// TestMessagesSayWhatIsWrong (issue 19 item 5): "replay hotel --from-seq
// 0" answered that hotel is no projection and to give --from-seq, which
// it had been given; "timeline --help" showed "--dir tripsaga up". Each
// message now names what is wrong.
func TestMessagesSayWhatIsWrong(t *testing.T) {
	bin := buildTripsaga(t)
	_, stderr, code := run(t, bin, "replay", "hotel", "--from-seq", "0")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "--from-seq 0: a stream's sequences start at 1")
	require.NotContains(t, stderr, "no such projection")
	for _, c := range []string{"timeline", "incidents", "replay", "outbox"} {
		out, _, code := run(t, bin, c, "--help")
		require.Equal(t, 0, code, c)
		require.NotContains(t, out, "--dir tripsaga up", c)
	}
}
