// Package fault holds the fault points compiled into the services: named
// places in the code (before a company call, between a commit and an ack,
// ...) where a process can be made to die, fail or wait on purpose, so
// that tests and operators can prove a crash at that exact line loses and
// doubles nothing. They are off unless the environment arms them, and then
// cost one atomic load each.
//
// # Arming
//
// TRIPSAGA_FAULTS holds comma-separated rules, each
//
//	<point>:<action>[:<option>]...
//
// point is one of [Points] ("<service>.<step>.<where>", e.g.
// payment.charge.after_call); action is
//
//   - kill: log the fault, then SIGKILL the process itself
//     (syscall.Kill(os.Getpid(), SIGKILL): no deferred function, no
//     graceful shutdown, exactly like a kill -9 from outside);
//   - error: the point returns an error wrapping [ErrInjected], which the
//     caller treats like the real failure at that spot (a connection lost
//     before the call, an answer that cannot be read, a step log or mark
//     that could not be written, an ack lost);
//   - delay=DUR: the point waits DUR (time.ParseDuration: 300ms, 2s), or
//     until the caller's context ends, which then fails the point like
//     the real deadline would.
//
// Options:
//
//   - once, once=NAME: the rule fires once, ever, across restarts and
//     replicas: before it fires, the process creates the marker file
//     $TRIPSAGA_FAULTS_DIR/NAME.fired with O_EXCL, and a rule whose marker
//     exists never fires again. A supervised process restarted with the
//     same environment therefore does not crash-loop on a kill rule.
//     NAME defaults to the point and action (e.g. payment.charge.after_call-kill);
//     name rules apart when one point is armed twice. once needs
//     TRIPSAGA_FAULTS_DIR.
//   - trip=PREFIX: the rule fires only for trips whose id starts with
//     PREFIX (a point that handles several trips at once, a relay batch or
//     an inbox batch, fires if any of them matches), so several rules can
//     be armed in one run.
//
// Example:
//
//	TRIPSAGA_FAULTS_DIR=/tmp/f TRIPSAGA_FAULTS=payment.charge.after_call:kill:once,car.book.answer_unread:delay=3s
//
// TRIPSAGA_FAULTS_FILE names a file of more rules (one per line or
// comma-separated, # starts a comment), read again whenever it changes
// (its mtime, size or inode, checked at every point hit while the
// variable is set), so a test can arm and disarm rules in running
// processes: write the new file and rename it over the old one. The file
// may be absent (no rules yet).
//
// A bad value (an unknown point or action, a bad duration, once without
// TRIPSAGA_FAULTS_DIR) makes the process refuse to start, naming the rule:
// the package checks the environment when the program starts (in its
// init) and exits with status 2. A file that turns bad at runtime is
// logged at error level and the rules read before it stay in force.
//
// Every fault fired is logged at warn level (msg "fault fired", with
// point, action, rule, trip_id and pid) before it acts.
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Environment variables.
const (
	// EnvRules holds comma-separated rules.
	EnvRules = "TRIPSAGA_FAULTS"
	// EnvFile names a file of rules, read again when it changes.
	EnvFile = "TRIPSAGA_FAULTS_FILE"
	// EnvDir is the folder of the once markers.
	EnvDir = "TRIPSAGA_FAULTS_DIR"
)

// Actions.
const (
	Kill  = "kill"
	Error = "error"
	Delay = "delay"
)

// ErrInjected is wrapped by the error a point armed with the error action
// returns.
var ErrInjected = errors.New("fault: injected error")

// Rule is one parsed rule.
type Rule struct {
	// Text is the rule as written.
	Text string
	// Point is the point's name.
	Point string
	// Action is Kill, Error or Delay; Wait is Delay's duration.
	Action string
	Wait   time.Duration
	// Once, when not empty, is the name of the rule's marker file.
	Once string
	// Trip is the prefix of the trip ids it fires for; "" fires for any.
	Trip string
}

// Parse parses rules separated by commas or line breaks; blank parts and
// text after # on a line are ignored. once needs dir (TRIPSAGA_FAULTS_DIR).
// The error names the first bad rule.
func Parse(s, dir string) ([]Rule, error) {
	var out []Rule
	for line := range strings.SplitSeq(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for text := range strings.SplitSeq(line, ",") {
			text = strings.TrimSpace(text)
			if text == "" {
				continue
			}
			r, err := parseRule(text, dir)
			if err != nil {
				return nil, fmt.Errorf("fault rule %q: %w", text, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func parseRule(text, dir string) (Rule, error) {
	parts := strings.Split(text, ":")
	if len(parts) < 2 {
		return Rule{}, errors.New("want <point>:<action>[:once[=NAME]][:trip=PREFIX]")
	}
	r := Rule{Text: text, Point: parts[0]}
	if !slices.Contains(Points, r.Point) {
		return Rule{}, fmt.Errorf("unknown point %q (the points are listed in internal/fault and docs/how-it-works.md, Fault points: <service>.<step>.<where>, e.g. %s)", r.Point, PaymentChargeAfterCall)
	}
	action, arg, hasArg := strings.Cut(parts[1], "=")
	switch {
	case (action == Kill || action == Error) && !hasArg:
		r.Action = action
	case action == Delay && hasArg:
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return Rule{}, fmt.Errorf("delay %q is not a positive duration such as 500ms or 2s", arg)
		}
		r.Action, r.Wait = Delay, d
	default:
		return Rule{}, fmt.Errorf("unknown action %q (want kill, error or delay=DUR)", parts[1])
	}
	for _, opt := range parts[2:] {
		name, val, hasVal := strings.Cut(opt, "=")
		switch {
		case name == "once" && !hasVal:
			r.Once = r.Point + "-" + r.Action
		case name == "once" && hasVal && val != "" && filepath.Base(val) == val && val != "." && val != "..":
			r.Once = val
		case name == "trip" && hasVal && val != "":
			r.Trip = val
		default:
			return Rule{}, fmt.Errorf("unknown option %q (want once, once=NAME or trip=PREFIX)", opt)
		}
	}
	if r.Once != "" && dir == "" {
		return Rule{}, fmt.Errorf("once needs %s, the folder of its marker files", EnvDir)
	}
	return r, nil
}

// config is the armed state; nil (no rules, no file) is off.
type config struct {
	dir   string
	rules []Rule // from TRIPSAGA_FAULTS
	file  string // TRIPSAGA_FAULTS_FILE

	mu        sync.Mutex
	stamp     fileStamp
	fileRules []Rule
}

type fileStamp struct {
	ok    bool
	mod   time.Time
	size  int64
	inode uint64
}

var (
	armed  atomic.Pointer[config]      //nolint:gochecknoglobals // the process's fault rules
	logger atomic.Pointer[slog.Logger] //nolint:gochecknoglobals // the process's fault logger
)

func init() {
	if err := Setup(os.Getenv(EnvRules), os.Getenv(EnvFile), os.Getenv(EnvDir)); err != nil {
		fmt.Fprintf(os.Stderr, "tripsaga: refusing to start: %v\n", err)
		os.Exit(2)
	}
}

// Setup arms the process with rules (TRIPSAGA_FAULTS's syntax), the rules
// file file and the marker folder dir, replacing what was armed; all
// empty disarms every point. The package's init calls it with the
// environment. A bad rule, or a rules file that exists and is bad, is an
// error naming the rule, and nothing changes.
func Setup(rules, file, dir string) error {
	rs, err := Parse(rules, dir)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvRules, err)
	}
	if len(rs) == 0 && file == "" {
		armed.Store(nil)
		return nil
	}
	c := &config{dir: dir, rules: rs, file: file}
	if file != "" {
		if err := c.reload(true); err != nil {
			return err
		}
	}
	armed.Store(c)
	return nil
}

// SetLogger sets the logger that reports fired faults (default: text on
// stderr).
func SetLogger(l *slog.Logger) { logger.Store(l) }

func log() *slog.Logger {
	if l := logger.Load(); l != nil {
		return l
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

// Armed reports whether any rule or rules file is armed.
func Armed() bool { return armed.Load() != nil }

// reload reads the rules file again if it changed. At start (strict) a
// bad file is an error; later it is logged and the rules read before stay.
func (c *config) reload(strict bool) error {
	var st fileStamp
	fi, err := os.Stat(c.file)
	if err == nil {
		st = fileStamp{ok: true, mod: fi.ModTime(), size: fi.Size()}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.inode = sys.Ino
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st == c.stamp && !strict {
		return nil
	}
	c.stamp = st
	if !st.ok {
		c.fileRules = nil
		return nil
	}
	b, err := os.ReadFile(c.file)
	if err == nil {
		var rs []Rule
		if rs, err = Parse(string(b), c.dir); err == nil {
			c.fileRules = rs
			return nil
		}
	}
	err = fmt.Errorf("%s %s: %w", EnvFile, c.file, err)
	if strict {
		return err
	}
	log().Error("fault: rules file not taken; the rules read before stay in force", "err", err)
	return nil
}

// Point is a fault point by its parts: service, step, where. Its name is
// "<service>.<step>.<where>" (see [Points]).
type Point struct{ Service, Step, Where string }

// At returns the point service.step.where. It costs nothing: the name is
// only built when a rule is armed.
func At(service, step, where string) Point { return Point{service, step, where} }

func (p Point) String() string { return p.Service + "." + p.Step + "." + p.Where }

// Hit runs the fault point p for trip ("" when no trip is known): nil,
// at the cost of one atomic load, unless a rule for p is armed; then the
// rule's action (see the package doc). The caller treats an error like the
// real failure at that spot.
func Hit(ctx context.Context, p Point, trip string) error {
	c := armed.Load()
	if c == nil {
		return nil
	}
	return c.hit(ctx, p, 1, func(int) string { return trip })
}

// HitAny is [Hit] for a point that handles n trips at once (a relay or
// inbox batch): trip(i) is the i-th one's id, asked only when a rule with
// trip= is armed for p.
func HitAny(ctx context.Context, p Point, n int, trip func(i int) string) error {
	c := armed.Load()
	if c == nil || n == 0 {
		return nil
	}
	return c.hit(ctx, p, n, trip)
}

func (c *config) hit(ctx context.Context, p Point, n int, trip func(int) string) error {
	if c.file != "" {
		_ = c.reload(false)
	}
	name := p.String()
	c.mu.Lock()
	rules := append(slices.Clip(c.rules), c.fileRules...)
	c.mu.Unlock()
	for _, r := range rules {
		if r.Point != name {
			continue
		}
		t, ok := r.match(n, trip)
		if !ok {
			continue
		}
		if r.Once != "" {
			if !c.claimOnce(r, name, t) {
				continue
			}
			return act(ctx, r, name) // claimOnce logged it
		}
		logFired(r, name, t)
		return act(ctx, r, name)
	}
	return nil
}

// match reports whether r fires for one of the n trips, and which.
func (r Rule) match(n int, trip func(int) string) (string, bool) {
	for i := range n {
		t := trip(i)
		if r.Trip == "" {
			return t, true
		}
		if strings.HasPrefix(t, r.Trip) {
			return t, true
		}
	}
	return "", false
}

// claimOnce creates r's marker file, whole or not at all: its content is
// written to a file of this process's own, which is then hard-linked to
// the marker's name (link(2) fails when the name exists, as O_EXCL does).
// A process killed meanwhile (another goroutine's kill rule) leaves no
// marker without its pid and trip, and the rule still to fire. The "fault
// fired" line is logged before the link, so that a marker always has its
// log line in the process it names, even when that process is killed
// right after the link by another goroutine's kill rule (a test reads the
// marker, then looks for the line); a hit that then loses the link to
// another process logs that it did nothing. It returns false when the
// marker exists (the rule fired before, in this process or another) or
// cannot be made.
func (c *config) claimOnce(r Rule, point, trip string) bool {
	path := filepath.Join(c.dir, r.Once+".fired")
	if _, err := os.Stat(path); err == nil {
		return false
	}
	tmp := fmt.Sprintf("%s.%d.%d.tmp", path, os.Getpid(), tmpSeq.Add(1))
	content := fmt.Sprintf("rule=%s point=%s pid=%d trip_id=%s at=%s\n", r.Text, point, os.Getpid(), trip, time.Now().UTC().Format(time.RFC3339Nano))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		log().Error("fault: cannot create the once marker; the rule does not fire", "rule", r.Text, "err", err)
		return false
	}
	defer os.Remove(tmp)
	logFired(r, point, trip)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			log().Warn("fault: another process fired this once rule first; this hit does nothing", "rule", r.Text, "pid", os.Getpid())
		} else {
			log().Error("fault: cannot create the once marker; the rule does not fire", "rule", r.Text, "err", err, "pid", os.Getpid())
		}
		return false
	}
	return true
}

// tmpSeq numbers this process's marker drafts.
var tmpSeq atomic.Int64 //nolint:gochecknoglobals // a counter

// Marker returns the path of the marker file of a rule armed with
// once=name in dir.
func Marker(dir, name string) string { return filepath.Join(dir, name+".fired") }

// logFired logs the line every fired fault has (the package comment).
func logFired(r Rule, point, trip string) {
	log().Warn("fault fired", "point", point, "action", r.Action, "rule", r.Text, "trip_id", trip, "pid", os.Getpid())
}

// act does what r's action says, once its firing is logged.
func act(ctx context.Context, r Rule, point string) error {
	switch r.Action {
	case Kill:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		for {
			time.Sleep(time.Second) //nolint:gosec // the SIGKILL is on its way: never returns
		}
	case Delay:
		t := time.NewTimer(r.Wait)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("fault: delay at %s: %w", point, ctx.Err())
		}
	}
	return fmt.Errorf("%w at %s (rule %q)", ErrInjected, point, r.Text)
}

// A call site: the step and trip of the company call under way, for the
// points of the HTTP client (provider), which knows neither.
type siteKey struct{}

type site struct{ service, op, trip string }

// stepOps names each step's forward and undo operations in point names.
var stepOps = map[string][2]string{ //nolint:gochecknoglobals // read-only
	"hotel": {"hold", "release"}, "payment": {"charge", "refund"}, "car": {"book", "cancel"}, "mail": {"mail", ""},
	"insurance": {"buy", "cancel"},
}

// StepOp returns the operation name of a saga step in point names: its
// forward call (hold, charge, book, buy, mail) or, when undo, its
// compensation or undo by key (release, refund, cancel). An unknown step names itself ("<step>" or
// "<step>_undo").
func StepOp(step string, undo bool) string {
	ops, ok := stepOps[step]
	switch {
	case !ok && undo:
		return step + "_undo"
	case !ok:
		return step
	case undo:
		return ops[1]
	}
	return ops[0]
}

// WithSite returns ctx naming the saga call under way (service, step,
// forward or undo, trip) for [HitSite]; ctx itself when nothing is armed.
func WithSite(ctx context.Context, service, step string, undo bool, trip string) context.Context {
	if armed.Load() == nil {
		return ctx
	}
	return context.WithValue(ctx, siteKey{}, site{service: service, op: StepOp(step, undo), trip: trip})
}

// HitSite is [Hit] on the point "<service>.<op>.<where>" of the call
// named by [WithSite] in ctx; nil when ctx names none.
func HitSite(ctx context.Context, where string) error {
	if armed.Load() == nil {
		return nil
	}
	s, ok := ctx.Value(siteKey{}).(site)
	if !ok {
		return nil
	}
	return Hit(ctx, At(s.service, s.op, where), s.trip)
}

// TripOfSubject returns the trip id of a NATS subject "<kind>.<trip>"
// (its last token).
func TripOfSubject(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
