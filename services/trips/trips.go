// Package trips is the trips service: the traveler-facing API of
// trips-api.md, and the projection of every step's events onto each trip's
// status. POST /trips records the trip and its trip.requested event in one
// transaction (the outbox). The projection follows hotel, payment and car
// events in any order; when a trip settles it publishes trip.confirmed (the
// forward-only "confirm" step after the pivot) or trip.canceled, and the
// mail step emails the traveler (forward-only: retried, never undone).
package trips

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/trips/internal/dbsqlc"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

var queries = dbsqlc.New() //nolint:gochecknoglobals // stateless

// Trip is the API's view of a trip (trips-api.md, GET /trips/{id}).
type Trip struct {
	TripID string            `json:"trip_id"`
	Status string            `json:"status"`
	Steps  map[string]string `json:"steps"`
	Reason string            `json:"reason,omitempty"`
	// OpenUndo names the steps whose undo raised its incident and is not
	// done yet, newest first, while the trip is canceling ([OpenUndos]).
	OpenUndo  []string            `json:"open_undo,omitempty"`
	CreatedAt time.Time           `json:"created_at"`
	SettledAt *time.Time          `json:"settled_at,omitempty"`
	Request   *events.TripRequest `json:"request,omitempty"`
	// Cancellation is the traveler's cancellation of the trip, if any.
	Cancellation *Cancellation `json:"cancellation,omitempty"`
}

func tripFromRow(row dbsqlc.Trip) Trip {
	// Times at PostgreSQL's precision (microseconds) whatever their
	// source, so an answer and its replay are byte-identical (issue 19
	// item 7: settled_at had nanoseconds in a first answer only).
	t := Trip{
		TripID: row.TripID, Status: row.Status, Steps: StepsOf(row.Version, row.Seen, row.Status),
		CreatedAt: row.CreatedAt.UTC().Truncate(time.Microsecond),
	}
	if row.Reason != nil {
		t.Reason = *row.Reason
	}
	if row.Status == StatusCanceling {
		t.OpenUndo = OpenUndosOf(row.Version, row.Seen)
	}
	if row.SettledAt != nil {
		s := row.SettledAt.UTC().Truncate(time.Microsecond)
		t.SettledAt = &s
	}
	var req events.TripRequest
	if json.Unmarshal(row.Request, &req) == nil {
		t.Request = &req
	}
	t.Cancellation = cancellationFromRow(row, req)
	return t
}

// Config configures the trips [Service].
type Config struct {
	Pool      *pgxpool.Pool
	JetStream jetstream.JetStream
	MailURL   string
	Timing    saga.Timing
	// Instance names this process among the trips replicas (see
	// saga.Liveness); "" = $TRIPSAGA_INSTANCE, else "<host>:trips".
	Instance   string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Policy is the traveler's cancellation fee policy; nil:
	// [DefaultPolicy].
	Policy *Policy
	// NoticeAfter is how long a trip may stay canceling, on the
	// database's clock, before its traveler gets the delay notice
	// (CANCELING_NOTICE_AFTER_MS); 0: [DefaultNoticeAfter].
	NoticeAfter time.Duration
	// Catalogue is the saga's steps in the order a new trip takes (its
	// version, events.VersionExtension; STEPS); the zero value is
	// events.Default. A trip already taken goes on in its own order.
	Catalogue events.Catalogue
}

// Service is the trips service.
type Service struct {
	cfg   Config
	log   *slog.Logger
	relay *outbox.Relay
	// uow runs the service's own transactions (a trip taken, a
	// cancellation, the notice pass) with the relay's publish after them.
	uow  outbox.UnitOfWork
	mail *saga.Runner
	// travelerMail emails the traveler once a cancellation is done (step
	// traveler_mail: a trip's step log has one row per step).
	travelerMail *saga.Runner
	// notice and correction send the traveler's other mails, a step each
	// (notice.go, correction.go).
	notice, correction *saga.Runner
	noticeAfter        time.Duration
	live               *saga.Liveness
	inboxes            []*inbox.Inbox
	mu                 sync.Mutex
	waiters            map[string]*waiter // trip id -> closed at its next status change
	// notified counts settled-trip notifications received from other
	// replicas; sender names this one in its own (random, per process).
	notified atomic.Int64
	sender   string
	policy   Policy
}

// New builds the service.
func New(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, log: cfg.Logger, waiters: map[string]*waiter{}, sender: rand.Text(), policy: DefaultPolicy()}
	if cfg.Policy != nil {
		s.policy = *cfg.Policy
	}
	if len(s.cfg.Catalogue.Steps) == 0 {
		s.cfg.Catalogue = events.Default
	}
	s.noticeAfter = cfg.NoticeAfter
	if s.noticeAfter <= 0 {
		s.noticeAfter = DefaultNoticeAfter
	}
	var err error
	s.relay, err = outbox.NewRelay(outbox.RelayConfig{
		Pool: cfg.Pool, JetStream: cfg.JetStream, Logger: cfg.Logger, Registerer: cfg.Registerer,
		EnsureStreams: func(ctx context.Context) error {
			n, _ := events.StreamReplicas()
			return events.EnsureServiceStreams(ctx, cfg.JetStream, s.cfg.Catalogue, "trips", n)
		},
	})
	if err != nil {
		return nil, err
	}
	s.uow = outbox.UnitOfWork{Pool: cfg.Pool, Relay: s.relay}
	mc := provider.Mail(cfg.MailURL)
	s.live = saga.NewLiveness(cfg.Pool, "trips", cfg.Instance, cfg.Logger)
	s.mail, err = saga.New(saga.Config{
		Pool: cfg.Pool, Timing: cfg.Timing, Liveness: s.live, Relay: s.relay, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Spec: saga.Spec{Name: "mail", Service: "trips", Class: events.ForwardOnly, Company: mc, ActiveStatus: mc.ActiveStatus, OnDone: events.MailSent},
	})
	if err != nil {
		return nil, err
	}
	s.travelerMail, err = saga.New(saga.Config{
		Pool: cfg.Pool, Timing: cfg.Timing, Liveness: s.live, Relay: s.relay, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Spec: saga.Spec{Name: "traveler_mail", Service: "trips", Class: events.ForwardOnly, Company: mc, ActiveStatus: mc.ActiveStatus, OnDone: events.MailSent},
	})
	if err != nil {
		return nil, err
	}
	// The delay notice and the correction: forward-only, and publishing
	// nothing (the step log and the mail relay are their record; mail.sent
	// stays the final mail's event).
	s.notice, err = saga.New(saga.Config{
		Pool: cfg.Pool, Timing: cfg.Timing, Liveness: s.live, Relay: s.relay, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Spec: saga.Spec{Name: NoticeStep, KeyName: NoticeKeyName, Service: "trips", Class: events.ForwardOnly, Company: mc, ActiveStatus: mc.ActiveStatus},
	})
	if err != nil {
		return nil, err
	}
	s.correction, err = saga.New(saga.Config{
		Pool: cfg.Pool, Timing: cfg.Timing, Liveness: s.live, Relay: s.relay, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Spec: saga.Spec{Name: CorrectionStep, KeyName: CorrectionKeyName, Service: "trips", Class: events.ForwardOnly, Company: mc, ActiveStatus: mc.ActiveStatus},
	})
	if err != nil {
		return nil, err
	}
	metrics, err := inbox.NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	// What the status follows in any trip version, not only in this
	// process's STEPS: a trip keeps the steps it started with.
	projection, _ := events.ProjectionAnyVersion("trips")
	for stream, filters := range events.Full().Streams(projection.Consumes) {
		in, err := inbox.New(inbox.Config{
			Name: "trips", Stream: stream, FilterSubjects: filters, Types: projection.Consumes,
			Pool: cfg.Pool, JetStream: cfg.JetStream, Handler: s.project, BatchApply: inbox.HandlerBatch(s.project),
			Relay: s.relay, Logger: cfg.Logger, Metrics: metrics,
		})
		if err != nil {
			return nil, err
		}
		s.inboxes = append(s.inboxes, in)
	}
	// The operators' actions naming trips: re-drive an event one of its
	// inboxes parked; retry, pause, resume or resolve on its mail steps.
	// Every action is observed: a repair of a confirmed trip at a step
	// service mails the traveler a correction (correction.go).
	op, err := saga.NewOperatorInbox(saga.OperatorInboxConfig{
		Service: "trips", Catalogue: s.cfg.Catalogue, Runners: []*saga.Runner{s.mail, s.travelerMail, s.notice, s.correction},
		Inboxes: func() []*inbox.Inbox { return s.inboxes },
		Pool:    cfg.Pool, JetStream: cfg.JetStream, Relay: s.relay, Logger: cfg.Logger, Metrics: metrics,
		Observe: s.observeAction,
	})
	if err != nil {
		return nil, err
	}
	if op != nil {
		s.inboxes = append(s.inboxes, op)
	}
	return s, nil
}

// Run registers the process among the trips replicas (saga.Liveness),
// runs the mail step's recovery pass, calls ready, then runs the relay,
// the mail runner, the inboxes and the settled-trip listener until ctx
// ends. Any number of replicas may run at once.
func (s *Service) Run(ctx context.Context, ready func()) error {
	if err := s.live.Start(ctx); err != nil {
		return err
	}
	defer s.live.Close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.live.Run(ctx) })
	g.Go(func() error { s.listenSettled(ctx); return nil })
	g.Go(func() error { return s.relay.Run(ctx) })
	if _, err := s.mail.RecoveryPass(ctx); err != nil {
		return fmt.Errorf("recovery pass: %w", err)
	}
	for _, r := range []*saga.Runner{s.travelerMail, s.notice, s.correction} {
		if _, err := r.RecoveryPass(ctx); err != nil {
			return fmt.Errorf("recovery pass: %w", err)
		}
	}
	if ready != nil {
		ready()
	}
	g.Go(func() error { return s.mail.Run(ctx) })
	g.Go(func() error { return s.travelerMail.Run(ctx) })
	g.Go(func() error { return s.notice.Run(ctx) })
	g.Go(func() error { return s.correction.Run(ctx) })
	g.Go(func() error { return s.runNotices(ctx) })
	for _, in := range s.inboxes {
		g.Go(func() error { return in.Run(ctx) })
	}
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Check returns an error when one of the service's inboxes has stalled
// (see inbox.Inbox.Check); for readiness.
func (s *Service) Check(ctx context.Context) error {
	return inbox.CheckAll(ctx, s.inboxes...)
}

// Inboxes returns the service's inboxes, for readiness
// (process.Process.AddInboxes).
func (s *Service) Inboxes() []*inbox.Inbox { return s.inboxes }

// project applies one step event to its trip, inside the inbox transaction.
func (s *Service) project(ctx context.Context, tx pgx.Tx, e event.Event) error {
	var d events.StepData
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	kind := events.Kind(e.Type())
	var reason *string
	if r := FailureReason(kind); r != "" {
		if d.Reason != "" && kind != "hotel.rejected" && kind != "car.rejected" {
			r = d.Reason
		}
		reason = &r
	}
	// One statement records the kind (and the first failure's reason) and
	// returns the row; the status is written only when it changes.
	row, err := queries.TripSeeEvent(ctx, tx, dbsqlc.TripSeeEventParams{TripID: e.Subject(), Kind: kind, Reason: reason})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: no trip %q", inbox.ErrPermanent, e.Subject())
	}
	if err != nil {
		return err
	}
	was := row.Status
	if was == StatusCancelingByTraveler || was == StatusCanceledByTraveler {
		return s.projectCancellation(ctx, tx, row)
	}
	if IsFinal(was) {
		return nil
	}
	row.Status = ProjectOf(row.Version, row.Seen)
	if row.Status == was {
		return nil
	}
	var evs []event.Event
	if IsFinal(row.Status) {
		var req events.TripRequest
		_ = json.Unmarshal(row.Request, &req)
		typ := events.TripConfirmed
		if row.Status == StatusCanceled {
			typ = events.TripCanceled
		}
		data := events.TripSettledData{TripID: row.TripID, Status: row.Status, Traveler: req.Traveler}
		if row.Reason != nil {
			data.Reason = *row.Reason
		}
		ev, err := events.New(events.Source("trips"), typ, row.TripID, data)
		if err != nil {
			return err
		}
		events.SetVersion(&ev, row.Version)
		evs = append(evs, ev)
		// The mail step (the catalogue's trigger: this event) is recorded
		// in the transaction that publishes its trigger, so it needs no
		// consumer of our own stream and no transaction of its own.
		if err := s.requestMail(ctx, tx, ev); err != nil {
			return err
		}
	}
	stamps, err := queries.TripSetStatus(ctx, tx, dbsqlc.TripSetStatusParams{
		TripID: row.TripID, Status: row.Status, Settle: IsFinal(row.Status),
	})
	if err != nil {
		return err
	}
	row.SettledAt, row.UpdatedAt = stamps.SettledAt, stamps.UpdatedAt
	if IsFinal(row.Status) {
		// Requests waiting on it at other replicas.
		if err := queries.TripNotifySettled(ctx, outbox.Later(tx), dbsqlc.TripNotifySettledParams{TripID: row.TripID, Sender: s.sender}); err != nil {
			return err
		}
	}
	// Without a commit hook the waiters' once-a-second read finds it.
	outbox.AfterCommit(ctx, func() { s.projected(row) })
	return outbox.Write(ctx, tx, evs...)
}

// projected wakes every request waiting on the trip after its status
// changed, handing them the row as committed (a row with only TripID
// set makes them read it).
func (s *Service) projected(row dbsqlc.Trip) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[row.TripID]; ok {
		w.row = row
		close(w.ch) // wakes every request waiting on this trip
		delete(s.waiters, row.TripID)
	}
}

// listenSettled wakes the requests waiting on a trip that settled
// whichever replica projected it (LISTEN trip_settled_<schema>, sent by
// TripNotifySettled at commit), until ctx ends. A lost connection is
// opened again after a second; every waiter is woken then, to read its
// trip, for what was missed meanwhile (and the waiters read once a second
// anyway).
func (s *Service) listenSettled(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.listenSettledOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("trips: LISTEN for settled trips lost; waiters read once a second meanwhile", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (s *Service) listenSettledOnce(ctx context.Context) error {
	conn, err := s.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var channel string
	if err := conn.QueryRow(ctx, "SELECT 'trip_settled_' || current_schema()").Scan(&channel); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.Background(), "UNLISTEN *") }()
	s.wakeAll() // what settled while we were not listening
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		trip, sender, _ := strings.Cut(n.Payload, " ")
		if sender == s.sender {
			continue // ours: woken with the row after our commit
		}
		s.notified.Add(1)
		s.projected(dbsqlc.Trip{TripID: trip}) // the waiters read it
	}
}

// wakeAll wakes every waiting request, to read its trip.
func (s *Service) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, w := range s.waiters {
		close(w.ch)
		delete(s.waiters, id)
	}
}

// waiter is closed at a trip's next status change, with the row then.
type waiter struct {
	ch  chan struct{}
	row dbsqlc.Trip
}

// changed returns the trip's waiter for its next status change.
func (s *Service) changed(trip string) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.waiters[trip]
	if !ok {
		w = &waiter{ch: make(chan struct{})}
		s.waiters[trip] = w
	}
	return w
}

// oneLine returns s with every control character and line break (see
// events.FindControl) and every byte that is not UTF-8 replaced by a
// space, so that nothing a traveler or a company sent can start a new line
// in a mail: the API refuses such names, and this also covers trips
// recorded before it did and the companies' reasons. Bidirectional and
// zero-width characters, which the API accepts, are shown as "<U+202E>"
// ([events.Visible]), so a name cannot reorder the mail's line.
func oneLine(s string) string {
	s = events.Visible(s)
	if _, _, bad := events.FindControl(s); !bad {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if events.IsControl(r) || (r == utf8.RuneError && size == 1) {
			r = ' '
		}
		b.WriteRune(r)
		i += size
	}
	return b.String()
}

// requestMail records the email of a settled trip (forward-only step) in
// tx, the transaction that publishes e (trip.confirmed or trip.canceled).
func (s *Service) requestMail(ctx context.Context, tx pgx.Tx, e event.Event) error {
	var d events.TripSettledData
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	if d.TripID != e.Subject() || d.Traveler.Email == "" {
		return fmt.Errorf("%w: %s without trip or traveler", inbox.ErrPermanent, e.Type())
	}
	trip, name, reason := oneLine(d.TripID), oneLine(d.Traveler.Name), oneLine(d.Reason)
	subject, text := "Your trip "+trip+" is confirmed", "Hello "+name+",\n\nyour room, payment and car are all booked. Have a good weekend!\n"
	if d.Status == StatusCanceled {
		subject = "Your trip " + trip + " was canceled"
		text = "Hello " + name + ",\n\nwe could not book your trip (" + reason + "). Nothing is held and any charge was refunded.\n"
	}
	runner := s.mail
	if d.Status == StatusCanceledByTraveler {
		subject, text = cancellationMail(trip, name, d)
		runner = s.travelerMail
	}
	_, err := runner.Request(ctx, tx, saga.Request{
		TripID: d.TripID, KeyName: "mail:" + d.Status,
		Body: map[string]string{"to": oneLine(d.Traveler.Email), "subject": subject, "text": text, "trip_id": d.TripID},
	})
	return err
}

// IsTripID reports whether id can name a trip: "T-" and a NATS subject
// token (events.ValidateTripID: printable ASCII, no '.', '*', '>').
// Anything else, a NUL or a byte that is not UTF-8 among them, names no
// trip and is never looked up.
func IsTripID(id string) bool {
	return strings.HasPrefix(id, "T-") && events.ValidateTripID(id) == nil
}

// Handler returns the API: POST /trips, GET /trips/{id}, GET /trips.
func (s *Service) Handler(mux *http.ServeMux) {
	mux.HandleFunc("POST /trips", s.postTrip)
	mux.HandleFunc("GET /trips/{id}", s.getTrip)
	mux.HandleFunc("GET /trips", s.listTrips)
	s.handleCancellation(mux)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Service) postTrip(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, Problem{Type: "https://tripsaga.io/problems/body-too-large", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("a trip request is at most %d bytes", MaxBodyBytes)})
		return
	}
	if err != nil {
		writeProblem(w, Problem{Type: problemInvalidRequest, Title: "Invalid trip request", Status: http.StatusBadRequest, Detail: "reading the body: " + err.Error()})
		return
	}
	req, errs := DecodeRequest(bytes.NewReader(raw), time.Now())
	key, detail := KeyOf(r.Header)
	if detail != "" {
		errs = append(errs, FieldError{Field: "Idempotency-Key", Pointer: "header:Idempotency-Key", Detail: detail})
	}
	if len(errs) > 0 {
		writeProblem(w, Problem{Type: problemInvalidRequest, Title: "Invalid trip request", Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%d field(s) are invalid", len(errs)), Errors: errs})
		return
	}
	wait, applied := ParseWait(r.Header)
	row, err := s.create(r.Context(), key, req)
	if errors.Is(err, errKeyReused) {
		writeProblem(w, Problem{Type: "https://tripsaga.io/problems/idempotency-key-reused", Title: "Idempotency-Key reused with a different body", Status: http.StatusConflict,
			Detail: "the Idempotency-Key " + strconv.Quote(key) + " was used for another trip request"})
		return
	}
	if err != nil {
		process.WriteError(w, r, s.log, "create trip", err)
		return
	}
	row = s.waitSettled(r.Context(), row, wait)
	if applied {
		w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
	}
	loc := "/trips/" + row.TripID
	w.Header().Set("Location", loc)
	code := http.StatusAccepted
	if IsFinal(row.Status) {
		code = http.StatusCreated
	}
	writeJSON(w, code, tripFromRow(row))
}

var errKeyReused = errors.New("trips: idempotency key reused with another body")

// create records a new trip and its trip.requested event in one
// transaction, or returns the trip already recorded under key.
func (s *Service) create(ctx context.Context, key string, req events.TripRequest) (dbsqlc.Trip, error) {
	fp := Fingerprint(req)
	var keyp *string
	if key != "" {
		keyp = &key
	}
	id := "T-" + ulid.Make().String()
	body, _ := json.Marshal(req)
	// The trip keeps the saga order it starts under (its version,
	// events.VersionExtension), whatever STEPS this service runs later.
	version := s.cfg.Catalogue.Version()
	var row dbsqlc.Trip
	err := s.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// The insert comes first and the key's unique index decides: a new
		// key costs no read, and of two POSTs racing with one key one
		// inserts.
		var err error
		row, err = queries.TripInsert(ctx, tx, dbsqlc.TripInsertParams{TripID: id, IdempotencyKey: keyp, Fingerprint: fp, Request: body, Version: version})
		if err != nil {
			return err // pgx.ErrNoRows: the key has its trip already
		}
		return publish(ctx, tx, events.TripRequested, id, version, events.TripRequestedData{TripID: id, Request: req})
	})
	if errors.Is(err, pgx.ErrNoRows) { // the key has its trip already
		row, err := queries.TripGetByIdempotencyKey(ctx, s.cfg.Pool, keyp)
		if err != nil {
			return row, err
		}
		if row.Fingerprint != fp {
			return row, errKeyReused
		}
		return row, nil
	}
	if err != nil {
		return dbsqlc.Trip{}, err
	}
	return row, nil
}

// publish writes the trips service's event of type typ about trip (data
// as its data, version the trip's) to the outbox in tx: the state change
// and its event in one transaction.
func publish(ctx context.Context, tx pgx.Tx, typ, trip, version string, data any) error {
	ev, err := events.New(events.Source("trips"), typ, trip, data)
	if err != nil {
		return err
	}
	events.SetVersion(&ev, version) // the trip's, events.VersionExtension
	return outbox.Write(ctx, tx, ev)
}

// waitSettled waits up to d for the trip to reach a final status, woken by
// the projection and checking the database every second besides (another
// request may be waiting on the same trip, and a wake can be missed).
func (s *Service) waitSettled(ctx context.Context, row dbsqlc.Trip, d time.Duration) dbsqlc.Trip {
	return s.waitUntil(ctx, row, d, IsFinal)
}

// waitUntil is waitSettled until done(status) instead of a final status.
func (s *Service) waitUntil(ctx context.Context, row dbsqlc.Trip, d time.Duration, done func(status string) bool) dbsqlc.Trip {
	if done(row.Status) || d <= 0 {
		return row
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	w := s.changed(row.TripID)
	for {
		select {
		case <-ctx.Done():
			return row
		case <-deadline.C:
			return row
		case <-w.ch:
			next := s.changed(row.TripID) // before reading, so no wake is missed
			if w.row.Status != "" {
				row = w.row // handed over by the projection: no read
			} else if cur, err := queries.TripGet(ctx, s.cfg.Pool, row.TripID); err == nil {
				row = cur
			}
			w = next
		case <-tick.C:
			// A wake can be missed (another process projected it, or a
			// commit that returned an error): read it once a second.
			w = s.changed(row.TripID)
			if cur, err := queries.TripGet(ctx, s.cfg.Pool, row.TripID); err == nil {
				row = cur
			}
		}
		if done(row.Status) {
			return row
		}
	}
}

func (s *Service) getTrip(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !IsTripID(id) {
		process.WriteNotFound(w, r, "Trip not found")
		return
	}
	row, err := queries.TripGet(r.Context(), s.cfg.Pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		process.WriteNotFound(w, r, "Trip not found")
		return
	}
	if err != nil {
		process.WriteError(w, r, s.log, "get trip", err)
		return
	}
	writeJSON(w, http.StatusOK, tripFromRow(row))
}

func (s *Service) listTrips(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var errs []FieldError
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, FieldError{Field: "limit", Pointer: "query:limit", Detail: "must be an integer from 1 to 1000"})
		}
		limit = n
	}
	var status, after *string
	if v := q.Get("status"); v != "" {
		if !slices.Contains([]string{StatusPending, StatusConfirmed, StatusCanceling, StatusCanceled, StatusCancelingByTraveler, StatusCanceledByTraveler}, v) {
			errs = append(errs, FieldError{Field: "status", Pointer: "query:status", Detail: "must be pending, confirmed, canceling, canceled, canceling_by_traveler or canceled_by_traveler"})
		}
		status = &v
	}
	if v := q.Get("after"); v != "" {
		if !IsTripID(v) {
			errs = append(errs, FieldError{Field: "after", Pointer: "query:after", Detail: "must be a cursor from a previous page's next"})
		}
		after = &v
	}
	if len(errs) > 0 {
		writeProblem(w, Problem{Type: problemInvalidQuery, Title: "Invalid query", Status: http.StatusBadRequest, Errors: errs})
		return
	}
	rows, err := queries.TripList(r.Context(), s.cfg.Pool, dbsqlc.TripListParams{Status: status, Before: after, Max: int32(limit + 1)})
	if err != nil {
		process.WriteError(w, r, s.log, "list trips", err)
		return
	}
	out := struct {
		Items []Trip `json:"items"`
		Next  string `json:"next,omitempty"`
	}{Items: []Trip{}}
	for i, row := range rows {
		if i == limit {
			out.Next = rows[i-1].TripID
			break
		}
		out.Items = append(out.Items, tripFromRow(row))
	}
	writeJSON(w, http.StatusOK, out)
}

// Run runs the trips service process.
func Run(ctx context.Context, env process.Env) error {
	if err := env.Require("NATS_URL", "DATABASE_URL", "HTTP_ADDR", "MAIL_URL"); err != nil {
		return fmt.Errorf("trips: %w", err)
	}
	p, err := process.Open(ctx, "trips", "trips", env, true, tripsql.SetSaga, tripsql.SetTrips)
	if err != nil {
		return fmt.Errorf("trips: %w", err)
	}
	defer p.Close()
	if err := p.ExportState("trips"); err != nil {
		return fmt.Errorf("trips: metrics: %w", err)
	}
	policy, err := LoadPolicy()
	if err != nil {
		return fmt.Errorf("trips: %w", err)
	}
	noticeAfter, err := NoticeAfterFromEnv()
	if err != nil {
		return fmt.Errorf("trips: %w", err)
	}
	s, err := New(Config{Pool: p.Pool, JetStream: p.JS, MailURL: env.CompanyURL("mail"), Timing: env.Timing(), Logger: p.Log, Registerer: p.Registry, Policy: &policy, NoticeAfter: noticeAfter, Catalogue: env.Steps()})
	if err != nil {
		return err
	}
	s.Handler(p.Mux)
	s.HandleLookup(p.Mux)
	p.HandleOps()
	p.AddInboxes(s.Inboxes)
	p.AddDetail(func(ctx context.Context) ([]string, error) { return outbox.Details(ctx, p.Pool) })
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Serve(ctx) })
	g.Go(func() error { return s.Run(ctx, p.SetReady) })
	return g.Wait()
}
