package natsauth_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

func repoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The committed server configuration compose ships is the one the Go
// definitions make for the catalogue the tests run (STEPS unset).
func TestServerConfIsCurrent(t *testing.T) {
	want := string(natsauth.ServerConf(events.Selected()))
	if got := repoFile(t, natsauth.ConfPath); got != want {
		t.Fatalf("%s is stale: run %s (or go generate ./events)\n%s", natsauth.ConfPath, natsauth.Generator, firstDiff(got, want))
	}
}

// SECURITY.md's NATS table is the one the Go definitions make for the
// catalogue the tests run: the identities testenv, up and compose
// configure, whose refusals the other tests of this package check.
func TestSecurityTableIsCurrent(t *testing.T) {
	got, err := natsauth.Region(repoFile(t, natsauth.SecurityPath))
	if err != nil {
		t.Fatal(err)
	}
	if want := natsauth.SecurityTable(events.Selected()); got != want {
		t.Fatalf("%s's NATS table differs from the identities the tests configure: run %s\n%s", natsauth.SecurityPath, natsauth.Generator, firstDiff(got, want))
	}
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ": committed\n  " + gl + "\nbut the definitions give\n  " + wl
		}
	}
	return ""
}
