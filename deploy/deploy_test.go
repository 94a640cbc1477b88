// Package deploy holds what operators load into their own tools: the
// Prometheus alert rules (prometheus/alerts.yaml, with promtool unit tests
// in prometheus/alerts_test.yaml and a scrape configuration for `tripsaga
// up`) and a Grafana dashboard (grafana/tripsaga.json). Its tests check them
// with promtool and against the metrics the code really exports.
package deploy

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// exportedMetrics returns the name of every metric the code exports: the
// Name of each prometheus.{Counter,Gauge,Histogram,Summary}Opts literal and
// the first argument of each prometheus.NewDesc in the module's non-test Go
// files (a histogram's or summary's series with their suffixes), and the Go
// and process collectors' metrics that every process registers
// (process).
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..")
	names := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !isPkg(sel.X, "prometheus") {
					return true
				}
				kind := sel.Sel.Name
				if kind != "CounterOpts" && kind != "GaugeOpts" && kind != "HistogramOpts" && kind != "SummaryOpts" {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
						name := literal(t, fset, kv.Value)
						if kind != "HistogramOpts" { // a histogram's series are its _bucket, _sum and _count
							names[name] = true
						}
						if kind == "HistogramOpts" || kind == "SummaryOpts" {
							names[name+"_sum"], names[name+"_count"] = true, true
						}
						if kind == "HistogramOpts" {
							names[name+"_bucket"] = true
						}
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && isPkg(sel.X, "prometheus") && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					names[literal(t, fset, n.Args[0])] = true
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func isPkg(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func literal(t *testing.T, fset *token.FileSet, e ast.Expr) string {
	t.Helper()
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		t.Fatalf("%s: a metric name that is not a string literal: this test cannot see it", fset.Position(e.Pos()))
	}
	s, err := strconv.Unquote(lit.Value)
	require.NoError(t, err)
	return s
}

// metricRef finds the metric names in a PromQL expression: ours
// (tripsaga_*) and the Go and process collectors' (go_*, process_*).
var metricRef = regexp.MustCompile(`\b(?:tripsaga|go|process)_[a-zA-Z0-9_]+\b`)

func checkExported(t *testing.T, where, expr string, exported []string) []string {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	for _, m := range refs {
		if !slices.Contains(exported, m) {
			t.Errorf("%s queries %s, which no process exports (expr %q)", where, m, expr)
		}
	}
	return refs
}

func TestExportedMetricsFound(t *testing.T) {
	exported := exportedMetrics(t)
	for _, want := range []string{"tripsaga_reconciler_findings", "tripsaga_incidents_raised_total", "tripsaga_outbox_pending", "go_goroutines"} {
		require.Contains(t, exported, want)
	}
}

// promtool runs promtool in dir, skipping the test when it is missing.
func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed: the alert rules are not checked (apt-get install prometheus provides /usr/bin/promtool; .ci/run installs it)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// TestAlertRules (issue 10 item 4): the rules pass `promtool check rules`
// and their unit tests (`promtool test rules`), the scrape configuration
// passes `promtool check config`, every metric a rule queries is exported
// by the code, and the alerts named in the issue are there.
func TestAlertRules(t *testing.T) {
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string            `yaml:"alert"`
				Expr  string            `yaml:"expr"`
				For   string            `yaml:"for"`
				Label map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &rules))
	exported := exportedMetrics(t)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			require.NotEmpty(t, checkExported(t, r.Alert, r.Expr, exported), "%s queries no tripsaga metric", r.Alert)
			require.Contains(t, []string{"page", "ticket"}, r.Label["severity"], "%s: severity", r.Alert)
		}
	}
	tested, err := os.ReadFile(filepath.Join("prometheus", "alerts_test.yaml"))
	require.NoError(t, err)
	for _, a := range alerts {
		if !strings.Contains(string(tested), "alertname: "+a+"\n") {
			t.Errorf("alerts_test.yaml does not test %s", a)
		}
	}
	for _, want := range []string{
		"TripsagaStuckTrips", "TripsagaHalfTrips", "TripsagaIncidentsOpen", "TripsagaConsumerLag",
		"TripsagaDeadLetters", "TripsagaRelayBacklog",
	} {
		require.Contains(t, alerts, want)
	}

	promtool(t, "prometheus", "check", "rules", "alerts.yaml")
	promtool(t, "prometheus", "test", "rules", "alerts_test.yaml")
	promtool(t, "prometheus", "check", "config", "prometheus.yml")
}

type panel struct {
	ID         int     `json:"id"`
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Datasource any     `json:"datasource"`
	Panels     []panel `json:"panels"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// TestGrafanaDashboard (issue 10 item 4): the dashboard is JSON Grafana
// can import (a uid, unique panel ids, every panel placed and bound to the
// datasource variable), every metric it queries is one the code exports,
// and every tripsaga metric the code exports is on it.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "tripsaga.json"))
	require.NoError(t, err)
	var d struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d), "grafana/tripsaga.json")
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Title)
	require.Positive(t, d.SchemaVersion)
	require.True(t, slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type string }) bool {
		return v.Name == "datasource" && v.Type == "datasource"
	}), "no datasource variable")

	exported := exportedMetrics(t)
	queried := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			require.False(t, ids[p.ID], "panel id %d twice", p.ID)
			ids[p.ID] = true
			require.NotNil(t, p.GridPos, "panel %q has no gridPos", p.Title)
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			require.NotEmpty(t, p.Targets, "panel %q queries nothing", p.Title)
			require.Contains(t, string(mustJSON(t, p.Datasource)), "${datasource}", "panel %q", p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.RefID)
				for _, m := range checkExported(t, "panel "+strconv.Quote(p.Title), tg.Expr, exported) {
					queried[m] = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, m := range exported {
		if strings.HasPrefix(m, "tripsaga_") && !queried[m] {
			t.Errorf("the dashboard shows nothing of %s, which the code exports", m)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
