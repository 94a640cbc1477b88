// Package process wires one OS process of a saga's system: configuration
// from the environment (trips-api.md), the PostgreSQL pool on the
// process's own schema, migrations, the NATS connection (with its identity,
// package natsauth) and streams, and the HTTP server with /healthz, /readyz
// and /metrics. [RunStep] runs a whole step service on it.
package process

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Env is the configuration every process reads from its environment.
type Env struct {
	NATSURL     string // NATS_URL
	DatabaseURL string // DATABASE_URL
	HTTPAddr    string // HTTP_ADDR
	// OpsAddr (OPS_ADDR), when set, is the only address serving /metrics,
	// /debug/pprof and the reconciler's dashboard (e.g. 127.0.0.1:9091):
	// HTTP_ADDR then answers 404 for them. Unset, HTTP_ADDR serves them.
	OpsAddr string
	// Companies are the base URLs of the saga's companies by step name
	// ("hotel" → the value of HOTEL_URL): [EnvFromOS] reads the variables
	// [CompanyVars] names, [EnvFromOSWith] those of another saga. See
	// [Env.CompanyURL].
	Companies map[string]string
	// companyVars names the variable of each entry of Companies (for
	// [Env.Require]).
	companyVars map[string]string
	// Timing knobs, in ms (0 = the saga package's defaults):
	// CALL_TIMEOUT_MS, STEP_DEADLINE_MS, UNDO_BACKOFF_MAX_MS,
	// INCIDENT_AFTER (attempts), VERIFY_AFTER_MS.
	CallTimeout, StepDeadline, UndoBackoffMax, VerifyAfter time.Duration
	IncidentAfter                                          int
	// IncidentOwner (INCIDENT_OWNER) names who answers for the service's
	// incidents (a team, a rota: "payments-oncall"); default the service's
	// name. IncidentEscalateAfter (INCIDENT_ESCALATE_AFTER_MS; default 30
	// minutes) is how long an incident may stay open before it escalates:
	// GET /incidents gives each its owner and escalates_at, and the gauge
	// tripsaga_incidents_escalated counts those past it (an alert pages).
	IncidentOwner         string
	IncidentEscalateAfter time.Duration
	// StreamReplicas is how many replicas the streams are created with
	// (STREAM_REPLICAS, 1 to 5; default 1; 3 on a three-node cluster). An
	// existing stream with fewer is raised to it; doctor refuses it above
	// the cluster's size.
	StreamReplicas int
	// NATSClient is the process's NATS identity and TLS files
	// (NATS_CREDS, NATS_CA_FILE, NATS_CERT_FILE, NATS_KEY_FILE; see
	// natsauth).
	NATSClient natsauth.Client
	// Catalogue is the saga's steps in the order STEPS gives
	// (events.FromEnv); the zero value means events.Default (see
	// [Env.Steps]).
	Catalogue events.Catalogue
}

// Steps returns e.Catalogue, or events.Default when e was not read from
// the environment (an Env a test builds). Every part of the process takes
// its catalogue from here: nothing below cmd/ reads STEPS itself.
func (e Env) Steps() events.Catalogue {
	if len(e.Catalogue.Steps) == 0 {
		return events.Default
	}
	return e.Catalogue
}

// CompanyVars returns the variable naming each company's base URL, by
// the step whose company it is, as the trip's contract sets them
// (docs/contracts/trips-api.md): HOTEL_URL, PAYMENTS_URL, CARS_URL,
// INSURER_URL (only when STEPS names insurance) and MAIL_URL (the trips
// service's mails).
func CompanyVars() map[string]string {
	return map[string]string{"hotel": "HOTEL_URL", "payment": "PAYMENTS_URL", "car": "CARS_URL", "insurance": "INSURER_URL", "mail": "MAIL_URL"}
}

// CompanyURL returns the base URL of the company of step ("" when its
// variable is not set): Companies[step].
func (e Env) CompanyURL(step string) string { return e.Companies[step] }

// EnvFromOS reads [Env] from the environment, the trip's companies
// ([CompanyVars]) among it. A timing variable that is set but not a
// non-negative integer is an error naming it.
func EnvFromOS() (Env, error) { return EnvFromOSWith(CompanyVars()) }

// EnvFromOSWith is [EnvFromOS] for a saga whose companies' base URLs are
// in the variables companies names, by step ("stock": "STOCK_URL").
func EnvFromOSWith(companies map[string]string) (Env, error) {
	var errs []error
	num := func(k string) int {
		v := os.Getenv(k)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a non-negative integer", k, v))
			return 0
		}
		return n
	}
	ms := func(k string) time.Duration { return time.Duration(num(k)) * time.Millisecond }
	e := Env{
		NATSURL: os.Getenv("NATS_URL"), DatabaseURL: os.Getenv("DATABASE_URL"), HTTPAddr: os.Getenv("HTTP_ADDR"), OpsAddr: os.Getenv("OPS_ADDR"),
		Companies: map[string]string{}, companyVars: companies,
		CallTimeout: ms("CALL_TIMEOUT_MS"), StepDeadline: ms("STEP_DEADLINE_MS"), UndoBackoffMax: ms("UNDO_BACKOFF_MAX_MS"),
		VerifyAfter: ms("VERIFY_AFTER_MS"), IncidentAfter: num("INCIDENT_AFTER"),
		IncidentOwner: os.Getenv("INCIDENT_OWNER"), IncidentEscalateAfter: ms("INCIDENT_ESCALATE_AFTER_MS"),
		NATSClient: natsauth.ClientFromEnv(),
	}
	for step, v := range companies {
		if u := os.Getenv(v); u != "" {
			e.Companies[step] = u
		}
	}
	var err error
	if e.StreamReplicas, err = events.StreamReplicas(); err != nil {
		errs = append(errs, err)
	}
	if _, err := events.StreamDuplicateWindow(); err != nil {
		errs = append(errs, err)
	}
	if e.Catalogue, err = events.FromEnv(); err != nil { // STEPS: the order of the saga's steps
		errs = append(errs, err)
	}
	return e, errors.Join(errs...)
}

// DefaultIncidentEscalateAfter is how long an incident stays open before
// it escalates when INCIDENT_ESCALATE_AFTER_MS is unset.
const DefaultIncidentEscalateAfter = 30 * time.Minute

// Owner is who owns the incidents of service: INCIDENT_OWNER, or the
// service's name.
func (e Env) Owner(service string) string {
	if e.IncidentOwner != "" {
		return e.IncidentOwner
	}
	return service
}

// EscalateAfter is INCIDENT_ESCALATE_AFTER_MS, or
// [DefaultIncidentEscalateAfter].
func (e Env) EscalateAfter() time.Duration {
	if e.IncidentEscalateAfter > 0 {
		return e.IncidentEscalateAfter
	}
	return DefaultIncidentEscalateAfter
}

// Require returns an error naming every listed variable that is empty.
func (e Env) Require(names ...string) error {
	vals := map[string]string{
		"NATS_URL": e.NATSURL, "DATABASE_URL": e.DatabaseURL, "HTTP_ADDR": e.HTTPAddr,
	}
	vars := e.companyVars
	if vars == nil {
		vars = CompanyVars() // an Env a test builds
	}
	for step, v := range vars {
		vals[v] = e.Companies[step]
	}
	var errs []error
	for _, n := range names {
		if vals[n] == "" {
			errs = append(errs, fmt.Errorf("%s is not set", n))
		}
	}
	return errors.Join(errs...)
}

// Process is one running service process.
type Process struct {
	Name     string
	Env      Env
	Log      *slog.Logger
	Pool     *pgxpool.Pool
	NATS     *nats.Conn
	JS       jetstream.JetStream
	Registry *prometheus.Registry
	Mux      *http.ServeMux
	// OpsMux holds the operations views (/metrics, /debug/pprof, the
	// reconciler's dashboard): Mux itself when Env.OpsAddr is empty,
	// otherwise a mux served on OPS_ADDR only.
	OpsMux  *http.ServeMux
	ready   atomic.Bool
	checks  []func(context.Context) error
	details []func(context.Context) ([]string, error)
	// inboxes are the process's inboxes, for /readyz (AddInboxes).
	inboxes []func() []*inbox.Inbox
	// ownStreams are the streams the process creates and updates;
	// keptStreams those it creates again when they are lost (its own and,
	// when it consumes, the dead-letter stream): see keepStreams.
	ownStreams, keptStreams []string
	stopKeeper              context.CancelFunc
	keeper                  sync.WaitGroup

	// stopTracing flushes the OTLP export (internal/tracing.Setup).
	stopTracing func(context.Context) error
}

// Open connects to PostgreSQL (search_path = schema, after applying the
// migration sets) and, when withNATS, to NATS: it runs doctor.Check on the
// live JetStream configuration with doctor.DefaultConfig (an error wrapping
// doctor.ErrViolation names every violation, and the process must not
// start), then creates the streams.
func Open(ctx context.Context, name, schema string, env Env, withNATS bool, sets ...string) (*Process, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("service", name)
	p := &Process{Name: name, Env: env, Log: log, Registry: prometheus.NewRegistry(), Mux: http.NewServeMux()}
	p.OpsMux = p.Mux
	if env.OpsAddr != "" {
		p.OpsMux = http.NewServeMux()
	}
	p.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// A pooler that shares server sessions between clients (PgBouncer in
	// transaction mode) would break the liveness lock, LISTEN and the
	// migrations' lock: refused here, naming what to set.
	if err := CheckSession(ctx, env.DatabaseURL); err != nil {
		return nil, postgresError(err, env.DatabaseURL)
	}
	// DATABASE_URL is the process's own role (internal/pgroles), which
	// owns schema: the migrations run as it.
	if err := tripsql.Migrate(ctx, env.DatabaseURL, schema, sets...); err != nil {
		return nil, postgresError(err, env.DatabaseURL)
	}
	cfg, err := pgxpool.ParseConfig(env.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	// search_path is set after connecting, not as a startup parameter,
	// which a pooler may refuse (PgBouncer 1.18 refuses every parameter
	// it does not track: "unsupported startup parameter: search_path").
	cfg.AfterConnect = tripsql.SetSearchPath(schema)
	cfg.ConnConfig.RuntimeParams["application_name"] = "tripsaga-" + name
	netSettings(cfg) // keepalives and timeouts: a silent peer is noticed (netconfig.go)
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	connectPacing(cfg) // no reconnect storm while PostgreSQL refuses (netconfig.go)
	p.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	p.checks = append(p.checks, func(ctx context.Context) error { return p.Pool.Ping(ctx) })
	if withNATS {
		// NATS_URL may list several servers, comma-separated (a cluster):
		// nats.Connect takes the list and reconnects to any of them.
		// It connects as its own identity (NATS_CREDS), with its own
		// inbox prefix, and may do only what natsauth allows it.
		// A call its identity may not make is refused asynchronously (the
		// request itself only times out): the refusal is logged, naming
		// the subject, so a process given another's NATS_CREDS says why.
		// During the start a refusal ends the start at once (its calls
		// would only time out): the identity is not this service's.
		start, refused := context.WithCancelCause(ctx)
		defer refused(nil)
		p.NATS, err = ConnectNATS(env, name, append(natsNetOptions(), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) {
					refused(err)
					log.Error("nats: refused by the server's permissions for this identity (NATS_CREDS; SECURITY.md)", "err", err)
					return
				}
				log.Warn("nats: asynchronous error", "err", err)
			}))...)
		if err != nil {
			p.Pool.Close()
			return nil, err
		}
		p.JS, err = jetstream.New(p.NATS)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		// The live configuration is checked before EnsureStreams, which
		// would otherwise fail on (or quietly rewrite) a stream someone
		// changed: a violation refuses the start, naming each one.
		// startErr names the refusal when the server refused this
		// identity a call of the start.
		startErr := func(err error) error {
			if cause := context.Cause(start); errors.Is(cause, nats.ErrPermissionViolation) {
				return fmt.Errorf("refusing to start: the NATS server refused %s a call it needs (is %s=%s %s's identity?): %w", name, natsauth.EnvCreds, env.NATSClient.Creds, name, cause)
			}
			return err
		}
		if err := WaitJetStream(start, p.JS, time.Minute); err != nil {
			p.Close()
			return nil, startErr(err)
		}
		dcfg := doctor.DefaultConfig(env.Steps())
		dcfg.StreamReplicas = max(env.StreamReplicas, 1)
		// Reading the configuration can time out while a cluster's
		// streams elect leaders (a node just restarted): that is asked
		// again for a minute, and only a violation refuses the start.
		fs, err := doctor.Check(start, p.NATS, p.JS, dcfg)
		for deadline := time.Now().Add(time.Minute); err != nil && time.Now().Before(deadline) && start.Err() == nil; {
			log.Warn("could not read the JetStream configuration for the start check; asking again", "err", err)
			time.Sleep(500 * time.Millisecond)
			fs, err = doctor.Check(start, p.NATS, p.JS, dcfg)
		}
		if err != nil {
			p.Close()
			return nil, startErr(fmt.Errorf("reading the JetStream configuration for the start check: %w", err))
		}
		if err := doctor.Err(fs); err != nil {
			p.Close()
			return nil, fmt.Errorf("refusing to start: %w", err)
		}
		if err := EnsureStreams(start, p.JS, env.Steps(), name, dcfg.StreamReplicas, 30*time.Second); err != nil {
			p.Close()
			return nil, startErr(err)
		}
		p.checks = append(p.checks, func(ctx context.Context) error {
			if !p.NATS.IsConnected() {
				return errors.New("nats: not connected")
			}
			_, err := p.JS.AccountInfo(ctx)
			return err
		}, p.checkOwnStreams)
		// A stream the process owns that is lost (deleted by hand, a
		// store wiped) is created again by the process itself, not only
		// when its relay next publishes: the services waiting for it
		// consume again once it is back.
		c := env.Steps()
		p.ownStreams = c.OwnedStreams(name)
		p.keptStreams = slices.Clone(p.ownStreams)
		if len(c.Consumes(name)) > 0 {
			p.keptStreams = append(p.keptStreams, events.StreamDeadLetter)
		}
		kctx, stop := context.WithCancel(ctx)
		p.stopKeeper = stop
		p.keeper.Add(1)
		go func() {
			defer p.keeper.Done()
			p.keepStreams(kctx, dcfg.StreamReplicas, KeepStreamsInterval)
		}()
	}
	// Spans are exported with OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set,
	// as service.name <name>; otherwise tracing stays off.
	if p.stopTracing, err = tracing.Setup(ctx, name, os.Getenv("TRIPSAGA_INSTANCE")); err != nil {
		p.Close()
		return nil, err
	}
	if tracing.Configured() {
		log.Info("tracing: spans exported with OTLP", "endpoint", os.Getenv(tracing.EnvEndpoint))
	}
	return p, nil
}

// ConnectNATS connects to env.NATSURL (one URL or a comma-separated list;
// tls:// for TLS) as identity (a service or natsauth.Admin) with the
// credentials and TLS files of env.NATSClient, its own inbox prefix, and
// the options given. An error names the URL and, when the server's
// certificate is not trusted, NATS_CA_FILE, or when it refuses the
// credentials, NATS_CREDS (the file, never the seed).
func ConnectNATS(env Env, identity string, opts ...nats.Option) (*nats.Conn, error) {
	aopts, err := env.NATSClient.Options(identity)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	nc, err := nats.Connect(env.NATSURL, append(append([]nats.Option{nats.Name("tripsaga-" + identity)}, opts...), aopts...)...)
	if err != nil {
		var unknownCA x509.UnknownAuthorityError
		var invalid x509.CertificateInvalidError
		var host x509.HostnameError
		if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &host) {
			ca := env.NATSClient.CAFile
			if ca == "" {
				ca = "unset: the system's roots"
			}
			return nil, fmt.Errorf("nats %s: the server's TLS certificate is not trusted (%s=%s): %w", redact.URL(env.NATSURL), natsauth.EnvCAFile, ca, err)
		}
		if errors.Is(err, nats.ErrAuthorization) {
			creds := env.NATSClient.Creds
			if creds == "" {
				creds = "unset: no credentials" //nolint:gosec // a placeholder shown instead of a path, not a credential
			}
			return nil, fmt.Errorf("nats %s: the server refused %s's credentials (%s=%s): %w", redact.URL(env.NATSURL), identity, natsauth.EnvCreds, creds, err)
		}
		return nil, fmt.Errorf("nats %s: %w", redact.URL(env.NATSURL), err)
	}
	return nc, nil
}

// postgresError names DATABASE_URL's sslrootcert when err is the
// server's TLS certificate not being trusted (sslmode=verify-ca or
// verify-full); other errors are returned as they are. pgx's errors name
// the host and user, never the password.
func postgresError(err error, databaseURL string) error {
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	if !errors.As(err, &unknownCA) && !errors.As(err, &invalid) && !errors.As(err, &host) {
		return err
	}
	root := "unset: the system's roots"
	if u, perr := url.Parse(databaseURL); perr == nil && u.Query().Get("sslrootcert") != "" {
		root = u.Query().Get("sslrootcert")
	}
	return fmt.Errorf("postgres: the server's TLS certificate is not trusted (DATABASE_URL sslrootcert=%s): %w", root, err)
}

// WaitJetStream waits until JetStream answers (its account info), at most
// for wait: a JetStream cluster answers nothing before its servers have
// elected a meta leader, which takes a few seconds after they start.
func WaitJetStream(ctx context.Context, js jetstream.JetStream, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jetstream did not answer within %s (a cluster without a meta leader?): %w", wait, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// EnsureStreams creates or updates the streams of catalogue c identity may (with
// replicas copies): every stream for natsauth.Admin
// (events.EnsureStreamsReplicas), a service's own streams and the
// dead-letter stream when missing (events.EnsureServiceStreams). It tries
// again for at most wait: in a JetStream cluster a stream being created,
// or raised to more replicas, by several processes at once may time out
// until its group has a leader.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c events.Catalogue, identity string, replicas int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var err error
		if identity == natsauth.Admin {
			err = events.EnsureStreamsReplicas(ctx, js, c, replicas)
		} else {
			err = events.EnsureServiceStreams(ctx, js, c, identity, replicas)
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// KeepStreamsInterval is how often a service process looks for the
// streams it creates (its own, and the dead-letter stream when it
// consumes) and creates again any that is lost.
const KeepStreamsInterval = 2 * time.Second

// keepStreams creates again, every interval until ctx ends, each of
// p.keptStreams that does not exist (with replicas copies), and logs it at
// error level: a stream lost at runtime comes back by itself.
func (p *Process) keepStreams(ctx context.Context, replicas int, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var missing []string
		for _, name := range p.keptStreams {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := p.JS.Stream(sctx, name)
			cancel()
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		changes, err := events.ApplyStreamsOf(sctx, p.JS, p.Env.Steps(), replicas, nil, missing)
		cancel()
		if err != nil {
			p.Log.Error("streams: lost, and cannot create them again yet; retrying", "streams", missing, "err", err)
			continue
		}
		for _, c := range changes {
			p.Log.Error("streams: lost (deleted?); created it again, empty", "stream", c.Stream, "replicas", c.Replicas)
		}
	}
}

// checkOwnStreams fails readiness while a stream the process owns does not
// exist (keepStreams creates it again within KeepStreamsInterval), except
// OPERATOR: it only feeds the operators' inboxes, and no process is ever
// unready for it (docs/contracts/trips-api.md), its owner the reconciler
// included.
func (p *Process) checkOwnStreams(ctx context.Context) error {
	for _, name := range p.ownStreams {
		if name == events.StreamOperator {
			continue
		}
		if _, err := p.JS.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s (%s's own) does not exist; %s creates it again within %s", name, p.Name, p.Name, KeepStreamsInterval)
		}
	}
	return nil
}

// AddInboxes makes /readyz check the inboxes inboxes returns
// (inbox.Readiness): an inbox that fails readiness (stalled, its consumer
// lost and being recreated) answers 503 with why; one whose stream does
// not exist yet, or an optional one (the operators' actions) that is not
// consuming, never fails it and is a line after "ready":
//
//	waiting for stream PAYMENT (created by payment at its start, or by tripsaga streams apply): consumer hotel consumes it once it appears
//	not consuming OPERATOR (operator actions only; never makes this process unready): inbox hotel: ...
func (p *Process) AddInboxes(inboxes func() []*inbox.Inbox) {
	p.inboxes = append(p.inboxes, inboxes)
}

// inboxReadiness is the readiness of the inboxes of AddInboxes: the
// lines to print and the first error that fails readiness.
func (p *Process) inboxReadiness(ctx context.Context) ([]string, error) {
	var lines []string
	for _, f := range p.inboxes {
		waits, err := inbox.Readiness(ctx, f()...)
		if err != nil {
			return nil, err
		}
		for _, w := range waits {
			lines = append(lines, WaitLine(p.Env.Steps(), w))
		}
	}
	return lines, nil
}

// WaitLine is the /readyz line of an inbox that waits without failing
// readiness (see [Process.AddInboxes]); c names the stream's owner.
func WaitLine(c events.Catalogue, w inbox.Wait) string {
	if errors.Is(w.Err, inbox.ErrStreamAppeared) {
		return fmt.Sprintf("stream %s has just appeared: consumer %s consumes it within %s", w.Stream, w.Consumer, inbox.StreamWaitMax)
	}
	if errors.Is(w.Err, inbox.ErrStreamMissing) {
		by := "its service"
		if o := c.StreamOwner(w.Stream); o != "" {
			by = o
		}
		return fmt.Sprintf("waiting for stream %s (created by %s at its start, or by tripsaga streams apply): consumer %s consumes it once it appears", w.Stream, by, w.Consumer)
	}
	what := "an optional inbox"
	if w.Stream == events.StreamOperator {
		what = "operator actions only"
	}
	return fmt.Sprintf("not consuming %s (%s; never makes this process unready): %v", w.Stream, what, w.Err)
}

// AddCheck adds a readiness check to /readyz (e.g. an inbox's progress).
func (p *Process) AddCheck(c func(context.Context) error) { p.checks = append(p.checks, c) }

// AddDetail adds lines that /readyz prints after "ready" without failing
// it (e.g. outbox events waiting out a JetStream outage): d returns none
// when all is well, or an error that is printed as a line.
func (p *Process) AddDetail(d func(context.Context) ([]string, error)) {
	p.details = append(p.details, d)
}

// SetReady marks the process ready (after its recovery pass).
func (p *Process) SetReady() { p.ready.Store(true) }

// Close releases connections and flushes the spans not yet exported.
func (p *Process) Close() {
	if p.stopKeeper != nil {
		p.stopKeeper()
		p.keeper.Wait()
	}
	if p.stopTracing != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = p.stopTracing(ctx)
		cancel()
		p.stopTracing = nil
	}
	if p.NATS != nil {
		p.NATS.Close()
	}
	if p.Pool != nil {
		p.Pool.Close()
	}
}

// Serve serves HTTP on Env.HTTPAddr until ctx ends: Mux plus /healthz,
// /readyz (ready, and PostgreSQL and NATS answer), and OpsMux's /metrics
// and /debug/pprof, on HTTP_ADDR, or, when OPS_ADDR is set, on OPS_ADDR
// only (with a /healthz). A path or
// method Mux does not serve answers 404 or 405 problem+json (see
// [Problems]); while NATS is disconnected every API path answers 503
// problem+json with Retry-After (see [Guard]).
func (p *Process) Serve(ctx context.Context) error {
	p.Mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	p.Mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if !p.ready.Load() {
			http.Error(w, "recovering", http.StatusServiceUnavailable)
			return
		}
		cctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		for _, c := range p.checks {
			if err := c(cctx); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		waits, err := p.inboxReadiness(cctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
		for _, l := range waits {
			_, _ = w.Write([]byte(l + "\n"))
		}
		for _, d := range p.details {
			lines, err := d(cctx)
			if err != nil {
				lines = []string{err.Error()}
			}
			for _, l := range lines {
				_, _ = w.Write([]byte(l + "\n"))
			}
		}
	})
	ops := p.OpsMux
	if ops == nil {
		ops = p.Mux
	}
	ops.Handle("GET /metrics", promhttp.HandlerFor(p.Registry, promhttp.HandlerOpts{}))
	ops.HandleFunc("GET /debug/pprof/", pprof.Index)
	ops.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	if ops != p.Mux {
		if err := p.serveOps(ctx, ops); err != nil {
			return err
		}
	}
	ln, err := Listen(p.Env.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR %s: %w", p.Env.HTTPAddr, err)
	}
	srv := &http.Server{Handler: tracing.Middleware(p.Name, p.Mux, Guard(p.NATS, Problems(p.Mux))), ReadHeaderTimeout: 5 * time.Second}
	go func() { //nolint:gosec // shutdown after ctx ended: a fresh context bounds it
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	p.Log.Info("listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// serveOps serves ops, plus /healthz, on Env.OpsAddr until ctx ends (in
// the background; an error is that of its listen).
func (p *Process) serveOps(ctx context.Context, ops *http.ServeMux) error {
	ops.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", p.Env.OpsAddr)
	if err != nil {
		return fmt.Errorf("OPS_ADDR %s: %w", p.Env.OpsAddr, err)
	}
	srv := &http.Server{Handler: Problems(ops), ReadHeaderTimeout: 5 * time.Second}
	go func() { //nolint:gosec // shutdown after ctx ended: a fresh context bounds it
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	p.Log.Info("operations views listening", "addr", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.Log.Error("operations views", "err", err)
		}
	}()
	return nil
}

// ListenFDEnv names the environment variable by which a supervisor
// (tripsaga up) hands a process the listening socket of its HTTP_ADDR as an
// inherited file descriptor, as systemd's socket activation does: the port
// stays the process's across restarts and no other program can take it
// between the supervisor choosing it and the process binding it.
const ListenFDEnv = "TRIPSAGA_LISTEN_FD"

// Listen returns the listener of the inherited socket named by
// TRIPSAGA_LISTEN_FD (a file descriptor number) when it is set, and
// otherwise listens on addr (TCP).
func Listen(addr string) (net.Listener, error) {
	v := os.Getenv(ListenFDEnv)
	if v == "" {
		return net.Listen("tcp", addr)
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: want an inherited file descriptor number (3 or more)", ListenFDEnv, v)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close() // FileListener dups it
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%s=%d: %w", ListenFDEnv, fd, err)
	}
	return ln, nil
}
