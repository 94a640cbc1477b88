package fault

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tripsaga/tripsaga/events"
)

func TestParse(t *testing.T) {
	rs, err := Parse("payment.charge.after_call:kill:once, car.book.answer_unread:delay=1500ms:trip=T-01\n# a comment\nhotel.relay.after_publish:error:once=r7 # trailing", "/tmp/d")
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Text: "payment.charge.after_call:kill:once", Point: PaymentChargeAfterCall, Action: Kill, Once: "payment.charge.after_call-kill"},
		{Text: "car.book.answer_unread:delay=1500ms:trip=T-01", Point: CarBookAnswerUnread, Action: Delay, Wait: 1500 * time.Millisecond, Trip: "T-01"},
		{Text: "hotel.relay.after_publish:error:once=r7", Point: HotelRelayAfterPublish, Action: Error, Once: "r7"},
	}
	if len(rs) != len(want) {
		t.Fatalf("got %+v", rs)
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Errorf("rule %d: got %+v, want %+v", i, rs[i], want[i])
		}
	}
	for _, bad := range []struct{ rule, says string }{
		{"payment.charge.afterr_call:kill", "unknown point"},
		{"payment.charge.after_call", "want <point>:<action>"},
		{"payment.charge.after_call:explode", "unknown action"},
		{"payment.charge.after_call:kill=3", "unknown action"},
		{"payment.charge.after_call:delay", "unknown action"},
		{"payment.charge.after_call:delay=soon", "not a positive duration"},
		{"payment.charge.after_call:delay=-1s", "not a positive duration"},
		{"payment.charge.after_call:kill:twice", "unknown option"},
		{"payment.charge.after_call:kill:once=../x", "unknown option"},
		{"payment.charge.after_call:kill:trip=", "unknown option"},
	} {
		_, err := Parse("hotel.hold.before_call:kill, "+bad.rule, "/tmp/d")
		if err == nil || !strings.Contains(err.Error(), bad.says) || !strings.Contains(err.Error(), `"`+bad.rule+`"`) {
			t.Errorf("%s: got %v, want an error naming the rule and saying %q", bad.rule, err, bad.says)
		}
	}
	if _, err := Parse("payment.charge.after_call:kill:once", ""); err == nil || !strings.Contains(err.Error(), EnvDir) {
		t.Errorf("once without a folder: %v", err)
	}
}

func TestPointsAreNamedFromTheirParts(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Points {
		if seen[p] {
			t.Errorf("%s listed twice", p)
		}
		seen[p] = true
		parts := strings.Split(p, ".")
		if len(parts) != 3 || At(parts[0], parts[1], parts[2]).String() != p {
			t.Errorf("%s is not <service>.<step>.<where>", p)
		}
	}
	for step, svc := range map[string]string{"hotel": "hotel", "payment": "payment", "car": "car", "insurance": "insurance", "mail": "trips"} {
		for _, w := range []string{BeforeCall, AnswerUnread, AfterCall, AfterLog} {
			if p := At(svc, StepOp(step, false), w).String(); !seen[p] {
				t.Errorf("%s is not listed", p)
			}
			if step != "mail" {
				if p := At(svc, StepOp(step, true), w).String(); !seen[p] {
					t.Errorf("%s is not listed", p)
				}
			}
		}
	}
}

// Every company step of the catalogue with every optional step on
// (events.Full) has its points, forward and undo, named by its own
// operations (not "<step>_undo"), and its service its relay and inbox
// points: a step added to the catalogue without them fails here.
func TestEveryStepOfTheFullCatalogueHasItsPoints(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Points {
		seen[p] = true
	}
	for _, s := range events.Full().Steps {
		if s.Class != events.Compensable && s.Class != events.Pivot {
			continue
		}
		if _, ok := stepOps[s.Name]; !ok {
			t.Errorf("step %s has no operations in stepOps", s.Name)
		}
		for _, undo := range []bool{false, true} {
			for _, w := range []string{BeforeCall, AnswerUnread, AfterCall, AfterLog} {
				if p := At(s.Service, StepOp(s.Name, undo), w).String(); !seen[p] {
					t.Errorf("step %s: %s is not listed", s.Name, p)
				}
			}
		}
		for _, p := range []string{At(s.Service, "relay", AfterPublish).String(), At(s.Service, "inbox", AfterCommit).String()} {
			if !seen[p] {
				t.Errorf("service %s: %s is not listed", s.Service, p)
			}
		}
	}
}

func arm(t *testing.T, rules, file, dir string) {
	t.Helper()
	if err := Setup(rules, file, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Setup("", "", "") })
}

func TestOffCostsNothing(t *testing.T) {
	arm(t, "", "", "")
	ctx := context.Background()
	p := At("payment", "charge", AfterCall)
	if n := testing.AllocsPerRun(100, func() {
		_ = Hit(ctx, p, "T-1")
		_ = HitSite(WithSite(ctx, "payment", "payment", false, "T-1"), AfterCall)
	}); n != 0 {
		t.Errorf("%v allocations per hit while off", n)
	}
}

func TestErrorDelayOnceAndTrip(t *testing.T) {
	dir := t.TempDir()
	arm(t, "payment.charge.after_call:error:trip=T-A,payment.refund.after_call:error:once=r1,car.book.answer_unread:delay=50ms,car.cancel.before_call:delay=1h", "", dir)
	ctx := context.Background()
	if err := Hit(ctx, At("payment", "charge", AfterCall), "T-B1"); err != nil {
		t.Errorf("another trip: %v", err)
	}
	if err := Hit(ctx, At("payment", "charge", AfterCall), "T-A1"); !errors.Is(err, ErrInjected) {
		t.Errorf("its trip: %v", err)
	}
	if err := Hit(ctx, At("payment", "charge", AfterCall), "T-A1"); !errors.Is(err, ErrInjected) {
		t.Errorf("without once it fires every time: %v", err)
	}
	if err := HitAny(ctx, At("payment", "charge", AfterCall), 3, func(i int) string { return []string{"T-B", "T-C", "T-A9"}[i] }); !errors.Is(err, ErrInjected) {
		t.Errorf("a batch with its trip: %v", err)
	}
	if err := Hit(ctx, At("payment", "refund", AfterCall), ""); !errors.Is(err, ErrInjected) {
		t.Errorf("once, first: %v", err)
	}
	if err := Hit(ctx, At("payment", "refund", AfterCall), ""); err != nil {
		t.Errorf("once, second: %v", err)
	}
	if _, err := os.Stat(Marker(dir, "r1")); err != nil {
		t.Errorf("marker: %v", err)
	}
	start := time.Now()
	if err := HitSite(WithSite(ctx, "car", "car", false, "T-1"), AnswerUnread); err != nil || time.Since(start) < 50*time.Millisecond {
		t.Errorf("delay: %v after %s", err, time.Since(start))
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := HitSite(WithSite(cctx, "car", "car", true, "T-1"), BeforeCall); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a delay past the caller's deadline fails like it: %v", err)
	}
	if err := HitSite(ctx, AfterCall); err != nil {
		t.Errorf("no site: %v", err)
	}
}

func TestRulesFileIsReadAgain(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules")
	arm(t, "", file, dir)
	ctx := context.Background()
	p := At("trips", "relay", AfterPublish)
	if err := Hit(ctx, p, "T-1"); err != nil {
		t.Fatalf("no file yet: %v", err)
	}
	write := func(s string) {
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("trips.relay.after_publish:error\n")
	if err := Hit(ctx, p, "T-1"); !errors.Is(err, ErrInjected) {
		t.Fatalf("armed by the file: %v", err)
	}
	write("trips.relay.after_publish:bogus\n")
	if err := Hit(ctx, p, "T-1"); !errors.Is(err, ErrInjected) {
		t.Fatalf("a bad file keeps the rules before it: %v", err)
	}
	write("# nothing\n")
	if err := Hit(ctx, p, "T-1"); err != nil {
		t.Fatalf("disarmed: %v", err)
	}
	if err := os.WriteFile(file, []byte("nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Setup("", file, dir); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("a bad file at start: %v", err)
	}
}

// TestKillAndRefusal runs this test binary as a child: with a bad rule it
// refuses to start, naming it; with a kill rule it dies of SIGKILL at the
// point without running its deferred functions, and with once it does not
// die again when started again with the same environment.
func TestKillAndRefusal(t *testing.T) {
	if os.Getenv("FAULT_TEST_CHILD") == "1" {
		defer os.Stdout.WriteString("deferred ran\n")
		_ = Hit(context.Background(), At("car", "book", AfterLog), "T-1")
		os.Stdout.WriteString("survived\n")
		return
	}
	dir := t.TempDir()
	run := func(rules string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillAndRefusal$", "-test.v")
		cmd.Env = append(os.Environ(), "FAULT_TEST_CHILD=1", EnvRules+"="+rules, EnvDir+"="+dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("car.book.after_log:kill, car.book.after_lgo:kill")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, `refusing to start: TRIPSAGA_FAULTS: fault rule "car.book.after_lgo:kill": unknown point`) {
		t.Fatalf("bad rule: %v\n%s", err, out)
	}
	for i, want := range []string{"killed", "survived"} {
		out, err = run("car.book.after_log:kill:once")
		killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
		if (want == "killed") != killed || strings.Contains(out, "deferred ran") && killed {
			t.Fatalf("run %d: want %s, got %v\n%s", i, want, err, out)
		}
		if want == "killed" && !strings.Contains(out, `level=WARN msg="fault fired" point=car.book.after_log action=kill`) {
			t.Fatalf("the fault is logged before it acts:\n%s", out)
		}
		if want == "survived" && !strings.Contains(out, "survived") {
			t.Fatalf("once: %s", out)
		}
	}
}
