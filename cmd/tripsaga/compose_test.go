package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/outbox"
)

type composeFile struct {
	Services map[string]struct {
		Image       string   `yaml:"image"`
		Command     []string `yaml:"command"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	require.NoError(t, err)
	return string(b)
}

// TestComposeFile (issue 7 item 17): compose.yaml is valid YAML; NATS is
// the version go.mod builds against; every tripsaga process has a health
// check through `tripsaga health` (the image has no curl); PostgreSQL's is
// over TCP; and .dockerignore keeps history and local state out of the
// build.
func TestComposeFile(t *testing.T) {
	var c composeFile
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "compose.yaml")), &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}

	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)`).FindStringSubmatch(readRepoFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod: no nats-server")
	}
	if want := "nats:" + m[1]; c.Services["nats"].Image != want {
		t.Errorf("nats image %q, want %q (go.mod)", c.Services["nats"].Image, want)
	}

	pg := c.Services["postgres"].Healthcheck.Test
	if !slices.Contains(pg, "pg_isready") || !slices.Contains(pg, "-h") {
		t.Errorf("postgres health check %v: want pg_isready -h (over TCP)", pg)
	}

	var seen []string
	for name, s := range c.Services {
		if len(s.Command) < 2 || s.Command[0] != "serve" {
			continue
		}
		seen = append(seen, s.Command[1])
		hc := s.Healthcheck.Test
		if len(hc) < 4 || hc[0] != "CMD" || hc[1] != "/tripsaga" || hc[2] != "health" || !strings.HasSuffix(hc[3], "/readyz") {
			t.Errorf("%s: health check %v, want [CMD /tripsaga health http://.../readyz]", name, hc)
		}
		if s.DependsOn["postgres"].Condition != "service_healthy" {
			t.Errorf("%s: does not wait for a healthy postgres", name)
		}
	}
	for _, p := range stack.Processes {
		if !slices.Contains(seen, p) {
			t.Errorf("compose.yaml does not run %s", p)
		}
	}

	ignore := strings.Fields(readRepoFile(t, ".dockerignore"))
	for _, want := range []string{".git", ".tripsaga"} {
		if !slices.Contains(ignore, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd", "sql"} {
		if slices.Contains(ignore, need) {
			t.Errorf(".dockerignore excludes %s, which the build needs", need)
		}
	}
}

// TestDocsStateMaxDeliver (issue 7 item 17): the README says exactly how
// MaxDeliver works: the inbox parks at its MaxDeliver while the server
// consumer has MaxDeliver -1.
func TestDocsStateMaxDeliver(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	for _, want := range []string{
		"`MaxDeliver` -1",
		"delivery " + strconv.Itoa(outbox.InboxMaxDeliverDefault),
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}
