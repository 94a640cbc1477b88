package reconciler

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/saga"
)

// Open step states, as the services' step logs name them (saga's steps
// table): the filter of the trip list takes these.
var openStates = []string{"pending", "started", "unknown", "compensating"} //nolint:gochecknoglobals // read-only

// Trip list limits.
const (
	// DefaultTripPage and MaxTripPage bound a page of the trip list.
	DefaultTripPage = 50
	MaxTripPage     = 1000
	// maxFilterChars bounds a text filter (error substring, names).
	maxFilterChars = 200
)

// TripFilter selects trips for the trip list (GET /api/trips, /trips,
// `tripsaga trips list`) and the bulk actions. A zero field does not
// filter. Its JSON is its query string's fields (MarshalJSON). The open-step fields (Step, State, Company, MinAttempts, Error)
// match the step the trip waits on as the services' step logs said at
// the last sweep (open_steps); a trip with no unfinished step matches
// none of them.
type TripFilter struct {
	// Status is the projection's status: pending, confirmed, canceling,
	// canceled, canceled_by_traveler...
	Status string
	// Step is the open step's name (hotel, payment, car, insurance,
	// mail...) and State its state: pending, started, unknown or
	// compensating.
	Step  string
	State string
	// Company is the service whose company the open step calls (hotel,
	// payment, car, insurance, trips).
	Company string
	// MinAttempts: the open step has made at least this many calls of
	// what it tries now (the undo's while compensating).
	MinAttempts int
	// Error is a substring of the open step's last error, any case.
	Error string
	// Paused is "true" (an operator paused the trip's calls at the open
	// step's service) or "false".
	Paused string
	// Finding is an open finding's kind (half, orphan, stuck, open_undo,
	// unattributed).
	Finding string
	// Version is the trip's version (its saga order,
	// "hotel,payment,car"); "default" selects the trips of before
	// versions (no version recorded).
	Version string
	// MinAge: the trip's first event is at least this old (by the
	// database's clock), e.g. 10m.
	MinAge time.Duration
	// From and To bound the trip's first event: From ≤ t < To (UTC).
	From time.Time
	To   time.Time
}

// MarshalJSON writes f as the object of its query string's fields
// ({"status":"canceling","min_age":"10m0s"}), the form the list takes.
func (f TripFilter) MarshalJSON() ([]byte, error) {
	m := map[string]string{}
	for k, v := range f.Query() {
		m[k] = v[0]
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads the form MarshalJSON writes; an error names the
// field (see [ParseTripFilter]).
func (f *TripFilter) UnmarshalJSON(b []byte) error {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("filter: an object of the trip list's fields: %w", err)
	}
	q := url.Values{}
	for k, v := range m {
		switch v := v.(type) {
		case string:
			q.Set(k, v)
		case float64:
			q.Set(k, strconv.FormatFloat(v, 'f', -1, 64))
		default:
			return &FilterError{Field: k, Detail: "a string or a number"}
		}
	}
	g, err := ParseTripFilter(q)
	if err != nil {
		field, detail, _ := strings.Cut(err.Error(), ": ")
		return &FilterError{Field: field, Detail: detail}
	}
	*f = g
	return nil
}

// FilterError is a filter refused for one of its fields (Field: "state",
// "min_attempt"...), from [TripFilter.UnmarshalJSON].
type FilterError struct{ Field, Detail string }

func (e *FilterError) Error() string { return "filter." + e.Field + ": " + e.Detail }

// Query returns f as the query string the list and the bulk actions take.
func (f TripFilter) Query() url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("status", f.Status)
	set("step", f.Step)
	set("state", f.State)
	set("company", f.Company)
	if f.MinAttempts > 0 {
		q.Set("min_attempts", strconv.Itoa(f.MinAttempts))
	}
	set("error", f.Error)
	set("paused", f.Paused)
	set("finding", f.Finding)
	set("version", f.Version)
	if f.MinAge > 0 {
		q.Set("min_age", f.MinAge.String())
	}
	if !f.From.IsZero() {
		q.Set("from", f.From.UTC().Format(time.RFC3339Nano))
	}
	if !f.To.IsZero() {
		q.Set("to", f.To.UTC().Format(time.RFC3339Nano))
	}
	return q
}

// Empty reports whether f selects every trip.
func (f TripFilter) Empty() bool { return f == TripFilter{} }

// String is f as the list's query string, unescaped, for people
// ("status=canceling&step=payment"), "every trip" when empty.
func (f TripFilter) String() string {
	if f.Empty() {
		return "every trip"
	}
	enc := f.Query().Encode()
	if s, err := url.QueryUnescape(enc); err == nil {
		return s // for people: "error=refund window"
	}
	return enc
}

// ParseTripFilter reads a [TripFilter] from a query string's values, all
// of which must be filters ([filterKeys]). An error names the field:
// "min_attempts: a whole number from 0", "min_attempt: not a filter of
// the trip list".
func ParseTripFilter(q url.Values) (TripFilter, error) {
	for k := range q {
		if !slices.Contains(filterKeys, k) {
			return TripFilter{}, fmt.Errorf("%s: not a filter of the trip list (those are %s)", k, strings.Join(filterKeys, ", "))
		}
	}
	return parseFilterValues(q)
}

// filterKeys are the trip list's filters, as query parameters.
var filterKeys = []string{"status", "step", "state", "company", "min_attempts", "error", "paused", "finding", "version", "min_age", "from", "to"} //nolint:gochecknoglobals // read-only

// listKeys are the trip list's other query parameters.
var listKeys = []string{"order", "limit", "cursor", "count"} //nolint:gochecknoglobals // read-only

// parseFilterValues reads the filter's values of q, ignoring other keys.
func parseFilterValues(q url.Values) (TripFilter, error) {
	var f TripFilter
	text := func(k string) (string, error) {
		raw := q.Get(k)
		v := strings.TrimSpace(raw)
		if !utf8.ValidString(v) || len(v) > maxFilterChars || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return "", fmt.Errorf("%s: at most %d characters of UTF-8 text, no control characters", k, maxFilterChars)
		}
		if v == "" && raw != "" {
			return "", fmt.Errorf("%s: blank; leave it out to not filter by it", k)
		}
		return v, nil
	}
	var err error
	for _, p := range []struct {
		k string
		v *string
	}{{"status", &f.Status}, {"step", &f.Step}, {"state", &f.State}, {"company", &f.Company}, {"error", &f.Error}, {"paused", &f.Paused}, {"finding", &f.Finding}, {"version", &f.Version}} {
		if *p.v, err = text(p.k); err != nil {
			return f, err
		}
	}
	if f.Status != "" && !slices.Contains(statuses, f.Status) {
		return f, fmt.Errorf("status: one of %s", strings.Join(statuses, ", "))
	}
	if f.State != "" && !slices.Contains(openStates, f.State) {
		return f, fmt.Errorf("state: one of %s (an open step's state)", strings.Join(openStates, ", "))
	}
	if f.Paused != "" && f.Paused != "true" && f.Paused != "false" {
		return f, errors.New("paused: true or false")
	}
	if f.Finding != "" && !slices.Contains(FindingKinds, f.Finding) {
		return f, fmt.Errorf("finding: one of %s", strings.Join(FindingKinds, ", "))
	}
	if v := q.Get("min_attempts"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return f, errors.New("min_attempts: a whole number from 0")
		}
		f.MinAttempts = n
	}
	if v := q.Get("min_age"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return f, errors.New("min_age: a duration such as 90s, 10m or 2h")
		}
		f.MinAge = d
	}
	for _, p := range []struct {
		k string
		t *time.Time
	}{{"from", &f.From}, {"to", &f.To}} {
		if v := q.Get(p.k); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, fmt.Errorf("%s: a time in RFC 3339, e.g. 2026-12-03T12:00:00Z", p.k)
			}
			*p.t = t.UTC()
		}
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return f, errors.New("to: must be after from")
	}
	return f, nil
}

// TripListItem is one trip of the list: its projection row, the step it
// waits on (nil when none is unfinished) and its open findings' kinds.
type TripListItem struct {
	TripID       string    `json:"trip_id"`
	Status       string    `json:"status"`
	Settled      string    `json:"settled,omitempty"`
	Version      string    `json:"version,omitempty"`
	FirstEventAt time.Time `json:"first_event_at"`
	LastEventAt  time.Time `json:"last_event_at"`
	// AgeMs is ms from the first event to when the list was read.
	AgeMs    int64     `json:"age_ms"`
	Events   int       `json:"events"`
	Seen     []string  `json:"seen"`
	OpenStep *OpenStep `json:"open_step,omitempty"`
	Findings []string  `json:"findings"`
}

// OpenStep is the step a trip waits on, as its service's step log said at
// the last sweep.
type OpenStep struct {
	Company   string    `json:"company"`
	Step      string    `json:"step"`
	State     string    `json:"state"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since"`
	Paused    bool      `json:"paused,omitempty"`
}

// TripPage is one page of the trip list. Next is the cursor of the page
// after it, "" on the last.
type TripPage struct {
	Items []TripListItem `json:"items"`
	Next  string         `json:"next_cursor,omitempty"`
	// Count is how many trips the filter matches, when asked.
	Count *int64 `json:"count,omitempty"`
}

// TripOrder is the trip list's order: by the first event's time, oldest
// or newest first.
type TripOrder string

// Trip list orders.
const (
	Oldest TripOrder = "oldest"
	Newest TripOrder = "newest"
)

// encodeCursor and decodeCursor write and read a page cursor: the last
// row's first event time and trip id.
func encodeCursor(at time.Time, trip string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + trip))
}

func decodeCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	at, trip, ok := strings.Cut(string(b), "|")
	if err != nil || !ok {
		return time.Time{}, "", errors.New("cursor: not a cursor this list gave (next_cursor)")
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return time.Time{}, "", errors.New("cursor: not a cursor this list gave (next_cursor)")
	}
	return t, trip, nil
}

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// listParams is f as the list queries' parameters.
func (f TripFilter) listParams() dbsqlc.TripListOldestParams {
	p := dbsqlc.TripListOldestParams{Status: strp(f.Status), Version: strp(f.Version), Step: strp(f.Step), State: strp(f.State),
		Company: strp(f.Company), Error: strp(f.Error), Finding: strp(f.Finding)}
	if f.Version == "default" {
		empty := ""
		p.Version = &empty
	}
	if !f.From.IsZero() {
		p.FromAt = &f.From
	}
	if !f.To.IsZero() {
		p.ToAt = &f.To
	}
	if f.MinAge > 0 {
		p.MinAgeMs = pgtype.Int8{Int64: f.MinAge.Milliseconds(), Valid: true}
	}
	if f.MinAttempts > 0 {
		n := int32(min(f.MinAttempts, 1<<30))
		p.MinAttempts = &n
	}
	if f.Paused != "" {
		p.Paused = pgtype.Bool{Bool: f.Paused == "true", Valid: true}
	}
	return p
}

// readList runs fn in a read-only transaction planned per call (see
// sql/queries/reconciler/trip_list.sql).
func (r *Reconciler) readList(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, r.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := queries.PlanCacheCustom(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// ListTrips returns a page of at most limit (1 to [MaxTripPage]) trips f
// matches in order, after cursor ("" for the first page), and their count
// when count is set.
func (r *Reconciler) ListTrips(ctx context.Context, f TripFilter, order TripOrder, cursor string, limit int, count bool) (TripPage, error) {
	page := TripPage{Items: []TripListItem{}}
	limit = min(max(limit, 1), MaxTripPage)
	p := f.listParams()
	p.Max = int32(limit + 1) // one more: is there a next page?
	if cursor != "" {
		at, trip, err := decodeCursor(cursor)
		if err != nil {
			return page, err
		}
		p.AfterAt, p.AfterID = &at, &trip
	}
	var rows []dbsqlc.TripListOldestRow
	var now time.Time
	err := r.readList(ctx, func(tx pgx.Tx) error {
		var err error
		if order == Newest {
			var nr []dbsqlc.TripListNewestRow
			nr, err = queries.TripListNewest(ctx, tx, dbsqlc.TripListNewestParams(p))
			for _, row := range nr {
				rows = append(rows, dbsqlc.TripListOldestRow(row))
			}
		} else {
			rows, err = queries.TripListOldest(ctx, tx, p)
		}
		if err != nil {
			return err
		}
		if count {
			n, err := queries.TripListCount(ctx, tx, f.countParams())
			if err != nil {
				return err
			}
			page.Count = &n
		}
		return tx.QueryRow(ctx, "SELECT now()").Scan(&now)
	})
	if err != nil {
		return page, fmt.Errorf("reconciler: trip list: %w", err)
	}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		page.Next = encodeCursor(last.FirstEventAt, last.TripID)
	}
	for _, row := range rows {
		it := TripListItem{TripID: row.TripID, Status: row.Status, Settled: deref(row.Settled), Version: row.Version,
			FirstEventAt: row.FirstEventAt.UTC(), LastEventAt: row.LastEventAt.UTC(), AgeMs: now.Sub(row.FirstEventAt).Milliseconds(),
			Events: int(row.Events), Seen: row.Seen, Findings: []string{}}
		if row.Findings != "" {
			it.Findings = strings.Split(row.Findings, ",")
		}
		if row.OpenStep != nil {
			it.OpenStep = &OpenStep{Company: deref(row.OpenService), Step: *row.OpenStep, State: deref(row.OpenState),
				LastError: deref(row.OpenError)}
			it.OpenStep.Paused = row.OpenPaused.Bool
			if row.OpenAttempts != nil {
				it.OpenStep.Attempts = int(*row.OpenAttempts)
			}
			if row.OpenSince != nil {
				it.OpenStep.Since = row.OpenSince.UTC()
			}
		}
		page.Items = append(page.Items, it)
	}
	return page, nil
}

func (f TripFilter) countParams() dbsqlc.TripListCountParams {
	p := f.listParams()
	return dbsqlc.TripListCountParams{Status: p.Status, Version: p.Version, FromAt: p.FromAt, ToAt: p.ToAt, MinAgeMs: p.MinAgeMs,
		Step: p.Step, State: p.State, Company: p.Company, MinAttempts: p.MinAttempts, Error: p.Error, Paused: p.Paused, Finding: p.Finding}
}

// CountTrips returns how many trips f matches.
func (r *Reconciler) CountTrips(ctx context.Context, f TripFilter) (int64, error) {
	var n int64
	err := r.readList(ctx, func(tx pgx.Tx) error {
		var err error
		n, err = queries.TripListCount(ctx, tx, f.countParams())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reconciler: trip count: %w", err)
	}
	return n, nil
}

// stateRank orders the open states when a trip has several unfinished
// steps: the one to show is the compensating one, then unknown, started,
// pending.
func stateRank(s string) int { return slices.Index(openStates, s) }

// openStepRow is a service's open step, for open_steps.
type openStepRow struct {
	service string
	saga.OpenStep
}

// attempts is the calls of what the step tries now.
func (o openStepRow) attempts() int {
	if o.Status == "compensating" {
		return o.UndoAttempts
	}
	return o.Attempts
}

// serviceOpenSteps pages through GET <base>/steps?open=1.
func serviceOpenSteps(ctx context.Context, base string) ([]saga.OpenStep, error) {
	var out []saga.OpenStep
	afterTrip, afterStep := "", ""
	for {
		var body struct {
			Items []saga.OpenStep `json:"items"`
			Last  bool            `json:"last"`
		}
		q := url.Values{"open": {"1"}, "limit": {strconv.Itoa(saga.MaxOpenStepsPage)}, "after_trip": {afterTrip}, "after_step": {afterStep}}
		if err := getJSON(ctx, base+"/steps?"+q.Encode(), &body); err != nil {
			return out, err
		}
		out = append(out, body.Items...)
		if body.Last || len(body.Items) == 0 {
			return out, nil
		}
		last := body.Items[len(body.Items)-1]
		afterTrip, afterStep = last.TripID, last.Step
	}
}

// refreshOpenSteps reads every service's unfinished steps and writes the
// one each trip waits on into open_steps in tx, ending the rows of the
// services that answered whose steps are final now. It returns the rows
// written and the services that could not be read (their rows stay).
func (r *Reconciler) refreshOpenSteps(ctx context.Context, tx pgx.Tx) (int, []string, error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	best := map[string]openStepRow{}
	var answered, unread []string
	for name, base := range r.cfg.Services {
		wg.Go(func() {
			got, err := serviceOpenSteps(ctx, base)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unread = append(unread, fmt.Sprintf("%s: %v", name, err))
				return
			}
			answered = append(answered, name)
			for _, s := range got {
				row := openStepRow{service: name, OpenStep: s}
				if b, ok := best[s.TripID]; !ok || cmp.Or(cmp.Compare(stateRank(s.Status), stateRank(b.Status)), s.Since.Compare(b.Since)) > 0 {
					best[s.TripID] = row
				}
			}
		})
	}
	wg.Wait()
	p := dbsqlc.OpenStepUpsertManyParams{ReadAt: time.Now()}
	for _, trip := range slices.Sorted(maps.Keys(best)) {
		b := best[trip]
		p.TripIds = append(p.TripIds, trip)
		p.Services = append(p.Services, b.service)
		p.Steps = append(p.Steps, b.Step)
		p.States = append(p.States, b.Status)
		p.Attempts = append(p.Attempts, int32(min(b.attempts(), 1<<30)))
		p.LastErrors = append(p.LastErrors, b.LastError)
		p.Sinces = append(p.Sinces, b.Since)
		p.Pauseds = append(p.Pauseds, b.Paused)
	}
	if _, err := queries.OpenStepDeleteOthers(ctx, tx, dbsqlc.OpenStepDeleteOthersParams{Services: answered, Keep: p.TripIds}); err != nil {
		return 0, unread, fmt.Errorf("open steps: %w", err)
	}
	if len(p.TripIds) > 0 {
		if err := queries.OpenStepUpsertMany(ctx, tx, p); err != nil {
			return 0, unread, fmt.Errorf("open steps: %w", err)
		}
	}
	slices.Sort(unread)
	return len(p.TripIds), unread, nil
}
