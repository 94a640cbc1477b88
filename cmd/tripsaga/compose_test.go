package main

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	require.NoError(t, err)
	return string(b)
}

// loadCompose loads compose.yaml with the Compose specification's own Go
// loader (what `docker compose` uses): schema validation, the x- anchors
// and merges resolved, depends_on cycles refused. The host's environment
// is not used, so nothing in the file may depend on it.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("tripsaga", true) })
	require.NoError(t, err, "compose.yaml does not load")
	return p
}

var notSet = regexp.MustCompile(`\b([A-Z][A-Z0-9_]*) is not set\b`)

// requiredEnv asks the process itself which variables it requires: it runs
// the process's runner (what `tripsaga serve <name>` runs) with an empty
// environment and a cancelled context, collects every "X is not set" of
// its error, sets those and runs it again, until it fails for another
// reason (it got as far as connecting, which the cancelled context stops).
func requiredEnv(t *testing.T, name string) []string {
	t.Helper()
	run := serveRunners()[name]
	require.NotNil(t, run, "no runner for %s", name)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var env process.Env
	var names []string
	for range 10 {
		done := make(chan error, 1)
		go func() { done <- run(ctx, env) }()
		var err error
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: runner did not return with a cancelled context", name)
		}
		var found []string
		if err != nil {
			for _, m := range notSet.FindAllStringSubmatch(err.Error(), -1) {
				found = append(found, m[1])
			}
		}
		if len(found) == 0 {
			break
		}
		for _, n := range found {
			if slices.Contains(names, n) {
				t.Fatalf("%s: still says %s is not set after it was set: %v", name, n, err)
			}
			names = append(names, n)
			setEnvField(t, &env, n)
		}
	}
	sort.Strings(names)
	return names
}

// setEnvField sets the process.Env field of variable n to a value that cannot
// be reached (127.0.0.1:1).
func setEnvField(t *testing.T, e *process.Env, n string) {
	t.Helper()
	switch n {
	case "NATS_URL":
		e.NATSURL = "nats://127.0.0.1:1"
	case "DATABASE_URL":
		e.DatabaseURL = "postgres://u:p@127.0.0.1:1/db?connect_timeout=1"
	case "HTTP_ADDR":
		e.HTTPAddr = "127.0.0.1:0"
	default:
		for step, v := range process.CompanyVars() {
			if v == n {
				if e.Companies == nil {
					e.Companies = map[string]string{}
				}
				e.Companies[step] = "http://127.0.0.1:1/" + step
				return
			}
		}
		t.Fatalf("a process requires %s, which process.Env does not know", n)
	}
}

// knownEnv is every variable a tripsaga process reads (process.Env, the
// reconciler's and the simulators' own, and what stack gives each child);
// compose.yaml may set no other.
var knownEnv = []string{
	"NATS_URL", "DATABASE_URL", "HTTP_ADDR", "HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL",
	"STREAM_REPLICAS", "TRIPSAGA_INSTANCE", "TRIPS_URL",
	"CALL_TIMEOUT_MS", "STEP_DEADLINE_MS", "UNDO_BACKOFF_MAX_MS", "INCIDENT_AFTER", "INCIDENT_OWNER", "INCIDENT_ESCALATE_AFTER_MS", "VERIFY_AFTER_MS",
	"RECONCILE_INTERVAL_MS", "STUCK_AFTER_MS", "SIM_MEMORY", "OPS_ADDR", natsauth.EnvCreds, "SERVICE_URLS",
}

// companyPath is the path of each company under the simulators' address
// (stack.CompanyURLs).
var companyPath = map[string]string{"HOTEL_URL": "/hotel", "PAYMENTS_URL": "/payments", "CARS_URL": "/cars", "MAIL_URL": "/mail"}

func envOf(s types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

func port(t *testing.T, hostport string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	require.NoError(t, err, "%q", hostport)
	return p
}

// TestComposeFile (issue 10 item 5): compose.yaml, loaded by compose-go,
// runs one container per process internal/stack starts, each with every
// variable the process itself requires (asked from the process) pointing
// at the right container, health-checked on /readyz through `tripsaga
// health`, and started in the stack's order: infrastructure first, then
// the simulators (healthy), then the services.
func TestComposeFile(t *testing.T) {
	p := loadCompose(t)

	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)`).FindStringSubmatch(readRepoFile(t, "go.mod"))
	require.NotNil(t, m, "go.mod: no nats-server")
	natsSvc, err := p.GetService("nats")
	require.NoError(t, err)
	if want := "nats:" + m[1]; natsSvc.Image != want {
		t.Errorf("nats image %q, want %q (go.mod)", natsSvc.Image, want)
	}
	if !slices.Contains(natsSvc.Command, "-js") {
		t.Errorf("nats command %v: JetStream (-js) is not on", natsSvc.Command)
	}

	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	require.NotNil(t, pg.HealthCheck, "postgres has no health check")
	if hc := pg.HealthCheck.Test; !slices.Contains(hc, "pg_isready") || !slices.Contains(hc, "-h") {
		t.Errorf("postgres health check %v: want pg_isready -h (over TCP)", hc)
	}
	pgEnv := envOf(pg)

	require.Contains(t, readRepoFile(t, "Dockerfile"), `ENTRYPOINT ["/tripsaga"]`)

	// Which container runs which process.
	byProcess := map[string]types.ServiceConfig{}
	for _, s := range p.Services {
		if len(s.Command) >= 2 && s.Command[0] == "serve" {
			if prev, ok := byProcess[s.Command[1]]; ok {
				t.Errorf("%s and %s both run serve %s", prev.Name, s.Name, s.Command[1])
			}
			byProcess[s.Command[1]] = s
		}
	}
	for name := range byProcess {
		if !slices.Contains(stack.Processes, name) {
			t.Errorf("compose.yaml runs serve %s, which stack does not start", name)
		}
	}
	sim, ok := byProcess["sim"]
	require.True(t, ok, "compose.yaml does not run the simulators")
	simPort := port(t, envOf(sim)["HTTP_ADDR"])

	for i, process := range stack.Processes {
		t.Run(process, func(t *testing.T) {
			s, ok := byProcess[process]
			if !ok {
				t.Fatalf("compose.yaml does not run %s (stack.Processes)", process)
			}
			if s.Name != process {
				t.Errorf("serve %s runs in service %q: name it %q as stack does", process, s.Name, process)
			}
			if s.Build == nil || s.Build.Context == "" {
				t.Errorf("%s: not built from the Dockerfile", s.Name)
			}
			if s.Restart == "" || s.Restart == "no" {
				t.Errorf("%s: restart %q; stack restarts a process that exits", s.Name, s.Restart)
			}

			env := envOf(s)
			required := requiredEnv(t, process)
			t.Logf("%s requires %v", process, required)
			require.NotEmpty(t, required, "the %s process requires no variable? (its runner did not say)", process)
			for _, n := range required {
				if env[n] == "" {
					t.Errorf("%s requires %s, which compose.yaml does not set", process, n)
				}
			}
			for n := range env {
				if !slices.Contains(knownEnv, n) {
					t.Errorf("%s: %s is set, but no tripsaga process reads it", s.Name, n)
				}
			}

			// Each variable points at the container that serves it.
			httpPort := ""
			for n, v := range env {
				switch n {
				case "HTTP_ADDR":
					httpPort = port(t, v)
				case "NATS_URL":
					u, err := url.Parse(v)
					require.NoError(t, err)
					if u.Scheme != "nats" || u.Hostname() != "nats" || u.Port() != "4222" {
						t.Errorf("%s: NATS_URL %q, want nats://nats:4222", s.Name, v)
					}
				case "DATABASE_URL":
					u, err := url.Parse(v)
					require.NoError(t, err)
					pw, _ := u.User.Password()
					// Each process connects as its own role
					// (pgroles), whose password the init script sets.
					role, ok := pgroles.ForProcess(pgroles.Default(), process)
					if !ok {
						t.Fatalf("%s: no PostgreSQL role for process %s", s.Name, process)
					}
					if u.Hostname() != "postgres" || u.Port() != "5432" || u.User.Username() != role.Name ||
						pw == "" || pw != pgEnv[rolePasswordVar(role.Name)] || strings.TrimPrefix(u.Path, "/") != pgEnv["POSTGRES_DB"] {
						t.Errorf("%s: DATABASE_URL %q does not match its role %s in the postgres service (%s)", s.Name, v, role.Name, rolePasswordVar(role.Name))
					}
				case "HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL":
					u, err := url.Parse(v)
					require.NoError(t, err)
					if u.Hostname() != "sim" || u.Port() != simPort || u.Path != companyPath[n] {
						t.Errorf("%s: %s %q, want http://sim:%s%s", s.Name, n, v, simPort, companyPath[n])
					}
				}
			}

			// Health: GET /readyz on the process's own port, by the binary.
			hc := s.HealthCheck
			switch {
			case hc == nil || hc.Disable:
				t.Errorf("%s: no health check", s.Name)
			case len(hc.Test) != 4 || hc.Test[0] != "CMD" || hc.Test[1] != "/tripsaga" || hc.Test[2] != "health":
				t.Errorf("%s: health check %v, want [CMD /tripsaga health http://127.0.0.1:PORT/readyz] (the image has no shell or curl)", s.Name, hc.Test)
			default:
				u, err := url.Parse(hc.Test[3])
				require.NoError(t, err)
				if u.Path != "/readyz" || u.Port() != httpPort {
					t.Errorf("%s: health check asks %s, want /readyz on HTTP_ADDR's port %s", s.Name, hc.Test[3], httpPort)
				}
				if hc.Interval == nil || hc.Retries == nil {
					t.Errorf("%s: health check without interval or retries", s.Name)
				}
			}
			for _, pc := range s.Ports {
				if strconv.Itoa(int(pc.Target)) != httpPort {
					t.Errorf("%s: publishes container port %d, but serves on %s", s.Name, pc.Target, httpPort)
				}
			}

			// Order: PostgreSQL healthy and NATS first; the simulators
			// (the companies) healthy before any service; otherwise only
			// processes stack starts earlier.
			if d, ok := s.DependsOn["postgres"]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: does not wait for a healthy postgres", s.Name)
			}
			if _, ok := s.DependsOn["nats"]; !ok {
				t.Errorf("%s: does not wait for nats", s.Name)
			}
			if process != "sim" {
				if d, ok := s.DependsOn["sim"]; !ok || d.Condition != types.ServiceConditionHealthy {
					t.Errorf("%s: does not wait for healthy simulators (stack starts them first: the services need their companies)", s.Name)
				}
			}
			if process != "sim" {
				if d, ok := s.DependsOn["streams"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
					t.Errorf("%s: does not wait for the streams to be applied (TestComposeStreamsApply)", s.Name)
				}
			}
			for dep := range s.DependsOn {
				if dep == "postgres" || dep == "nats" || dep == "streams" {
					continue
				}
				j := slices.Index(stack.Processes, dep)
				if j < 0 || j >= i {
					t.Errorf("%s depends on %s, which stack starts after it", s.Name, dep)
				}
			}
		})
	}

	for _, infra := range []string{"nats", "postgres"} {
		s, _ := p.GetService(infra)
		for dep, d := range s.DependsOn {
			// NATS waits only for its users' keys (TestComposeNATSIdentities).
			if infra == "nats" && dep == "nats-auth" && d.Condition == types.ServiceConditionCompletedSuccessfully {
				continue
			}
			t.Errorf("%s depends on %s: infrastructure starts first", infra, dep)
		}
	}

	ignore := strings.Fields(readRepoFile(t, ".dockerignore"))
	for _, want := range []string{".git", ".tripsaga", "**/node_modules"} {
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

// TestDocsStateMaxDeliver (issue 7 item 17): the docs say exactly how
// MaxDeliver works: the inbox parks at its MaxDeliver while the server
// consumer has MaxDeliver -1. The inbox rule lives in
// docs/how-it-works.md ("The rules, and where they live"), which the
// README's front page links.
func TestDocsStateMaxDeliver(t *testing.T) {
	const page = "docs/how-it-works.md"
	doc := readRepoFile(t, page)
	for _, want := range []string{
		"`MaxDeliver` -1",
		"delivery " + strconv.Itoa(inbox.MaxDeliverDefault),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("%s does not say %q", page, want)
		}
	}
}

// mountOf returns where s mounts the volume or file source (a bind's
// source ends with it), and whether it does.
func mountOf(s types.ServiceConfig, source string) (types.ServiceVolumeConfig, bool) {
	for _, v := range s.Volumes {
		if v.Source == source || (v.Type == types.VolumeTypeBind && strings.HasSuffix(v.Source, string(filepath.Separator)+source)) {
			return v, true
		}
	}
	return types.ServiceVolumeConfig{}, false
}

// TestComposeNATSIdentities (issue 9 item 1): compose's NATS server runs
// the committed configuration of natsauth, with the public keys
// that `tripsaga nats-auth` writes into a volume before it starts; every
// process with a NATS identity gets its own seed file of that volume as
// NATS_CREDS (read-only), and the simulators none.
func TestComposeNATSIdentities(t *testing.T) {
	p := loadCompose(t)
	auth, err := p.GetService("nats-auth")
	require.NoError(t, err, "compose.yaml has no nats-auth service")
	require.GreaterOrEqual(t, len(auth.Command), 3)
	require.Equal(t, "nats-auth", auth.Command[0])
	i := slices.Index(auth.Command, "--dir")
	require.True(t, i > 0 && i+1 < len(auth.Command), "nats-auth without --dir: %v", auth.Command)
	authDir := auth.Command[i+1]
	var volume string
	for _, v := range auth.Volumes {
		if v.Target == authDir && v.Type == types.VolumeTypeVolume {
			volume = v.Source
		}
	}
	require.NotEmpty(t, volume, "nats-auth does not write %s into a volume", authDir)
	if auth.Restart != "" && auth.Restart != "no" {
		t.Errorf("nats-auth restart %q: it runs once", auth.Restart)
	}

	natsSvc, err := p.GetService("nats")
	require.NoError(t, err)
	c := slices.Index(natsSvc.Command, "-c")
	require.True(t, c >= 0 && c+1 < len(natsSvc.Command), "nats runs without -c: %v", natsSvc.Command)
	conf := natsSvc.Command[c+1]
	m, ok := mountOf(natsSvc, filepath.FromSlash(natsauth.ConfPath))
	if !ok || m.Target != conf || !m.ReadOnly {
		t.Errorf("nats: %s is not mounted read-only at %s (%+v)", natsauth.ConfPath, conf, natsSvc.Volumes)
	}
	keys, ok := mountOf(natsSvc, volume)
	// The configuration includes auth/nkeys.conf next to itself.
	if want := filepath.ToSlash(filepath.Join(filepath.Dir(conf), filepath.Dir(natsauth.ConfInclude))); !ok || keys.Target != want {
		t.Errorf("nats: volume %s is not mounted at %s, where %s includes %s", volume, want, conf, natsauth.ConfInclude)
	}
	if d, ok := natsSvc.DependsOn["nats-auth"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("nats does not wait for nats-auth to complete")
	}
	require.Contains(t, readRepoFile(t, natsauth.ConfPath), `include "`+natsauth.ConfInclude+`"`)

	for _, process := range stack.Processes {
		s, err := p.GetService(process)
		require.NoError(t, err)
		creds := envOf(s)[natsauth.EnvCreds]
		if _, ok := natsauth.Lookup(events.Default, process); !ok {
			if creds != "" {
				t.Errorf("%s: NATS_CREDS %q, but it has no NATS identity", process, creds)
			}
			continue
		}
		v, ok := mountOf(s, volume)
		if !ok {
			t.Errorf("%s: does not mount the %s volume", process, volume)
			continue
		}
		if !v.ReadOnly {
			t.Errorf("%s: mounts the %s volume writable", process, volume)
		}
		if want := v.Target + "/" + process + natsauth.CredsExt; creds != want {
			t.Errorf("%s: NATS_CREDS %q, want its own seed %s", process, creds, want)
		}
	}
}

// TestComposeStreamsApply: compose makes every stream once, as the admin
// identity, before the services start: a one-shot `tripsaga streams
// apply` reading admin's seed from the natsauth volume, after NATS has
// started (it waits for JetStream itself).
func TestComposeStreamsApply(t *testing.T) {
	p := loadCompose(t)
	s, err := p.GetService("streams")
	require.NoError(t, err, "compose.yaml has no streams service")
	require.GreaterOrEqual(t, len(s.Command), 2)
	require.Equal(t, []string{"streams", "apply"}, []string(s.Command[:2]))
	if s.Restart != "" && s.Restart != "no" {
		t.Errorf("streams restart %q: it runs once", s.Restart)
	}
	if _, ok := s.DependsOn["nats"]; !ok {
		t.Errorf("streams does not wait for nats")
	}
	for dep := range s.DependsOn {
		if dep != "nats" {
			t.Errorf("streams depends on %s: it needs NATS only", dep)
		}
	}
	env := envOf(s)
	require.Equal(t, "nats://nats:4222", env["NATS_URL"])
	auth, err := p.GetService("nats-auth")
	require.NoError(t, err)
	authVolume := ""
	for _, v := range auth.Volumes {
		if v.Type == types.VolumeTypeVolume {
			authVolume = v.Source
		}
	}
	v, ok := mountOf(s, authVolume)
	require.True(t, ok, "streams does not mount the %s volume", authVolume)
	require.True(t, v.ReadOnly, "streams mounts the %s volume writable", authVolume)
	require.Equal(t, v.Target+"/"+natsauth.Admin+natsauth.CredsExt, env[natsauth.EnvCreds], "streams runs as admin, the one identity that may create every stream")
}
