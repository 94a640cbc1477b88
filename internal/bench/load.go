package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/tripsaga/tripsaga/events"
)

// ErrBadFlag is wrapped by [CheckURL] and [Config.Validate] for input the
// bench refuses.
var ErrBadFlag = errors.New("bench: invalid input")

// CheckURL checks that s is an absolute http or https URL with a host, such
// as http://127.0.0.1:7405, and returns it without a trailing slash.
func CheckURL(name, s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%w: %s %q: want an absolute http:// or https:// URL with a host, e.g. http://127.0.0.1:7405", ErrBadFlag, name, s)
	}
	return strings.TrimRight(s, "/"), nil
}

// Count is one value and how often it occurred.
type Count struct {
	Value string `json:"value"`
	N     int    `json:"n"`
}

// counts turns a map into Counts, most frequent first, then by value.
func counts(m map[string]int) []Count {
	out := make([]Count, 0, len(m))
	for k, v := range m {
		out = append(out, Count{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Value < out[j].Value
	})
	return out
}

// FormatCounts prints counts as "confirmed 20, canceled 1" ("none" when
// empty).
func FormatCounts(cs []Count) string {
	if len(cs) == 0 {
		return "none"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s %d", c.Value, c.N)
	}
	return strings.Join(parts, ", ")
}

// Percentiles of answer times, ms.
type Percentiles struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func percentiles(lat []time.Duration) Percentiles {
	if len(lat) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	at := func(p float64) float64 {
		return round(float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())/1000, 1)
	}
	return Percentiles{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: at(1)}
}

// LoadRun is one closed- or open-loop run of trips.
type LoadRun struct {
	// Mode is "closed" (Clients book one trip after another) or "open"
	// (trips sent at OfferedPerS whatever the answers).
	Mode    string `json:"mode"`
	Clients int    `json:"clients,omitempty"`
	// OfferedPercent is the share of the closed loop's maximum offered.
	OfferedPercent int     `json:"offered_percent,omitempty"`
	OfferedPerS    float64 `json:"offered_per_s,omitempty"`
	Trips          int     `json:"trips"`
	// Answers counts the trips' statuses as finally known (the answer's, or
	// GET /trips/{id} for a trip answered 202).
	Answers []Count `json:"answers"`
	// Errors counts requests without a 201/202 answer, by reason.
	Errors    []Count `json:"errors"`
	Confirmed int     `json:"confirmed"`
	// AchievedPerS is confirmed trips over the time from the first request
	// to the last answer, trips/s.
	AchievedPerS float64     `json:"achieved_per_s"`
	DurationS    float64     `json:"duration_s"`
	Answer       Percentiles `json:"answer"`
	// Settled: every trip confirmed and, after the run, no trip pending or
	// canceling (and, on a system the bench started, every trip settled and
	// mailed in the reconciler's view).
	Settled     bool   `json:"settled"`
	SettledNote string `json:"settled_note,omitempty"`

	tripIDs []string
	samples []sample
	start   time.Time
}

// sample is one answered request, for the charts.
type sample struct {
	at  time.Time // when the answer arrived
	lat time.Duration
}

// loader books trips on one trips API.
type loader struct {
	url      string   // the trips service: reads, and POSTs unless posts is set
	posts    []string // every replica of the trips service, POSTs spread over them
	client   *http.Client
	run      string // distinguishes Idempotency-Keys of bench runs
	seq      atomic.Int64
	progress io.Writer // nil: no progress bar
}

func newLoader(tripsURL string, progress io.Writer) *loader {
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 90 * time.Second}
	return &loader{
		url: tripsURL, client: &http.Client{Transport: tr, Timeout: 90 * time.Second},
		run: fmt.Sprintf("bench-%d", time.Now().UnixNano()), progress: progress,
	}
}

// newReplicaLoader is a loader that sends trip i's POST to replica i mod
// len(urls) of the trips service (every replica answers every read).
func newReplicaLoader(urls []string, progress io.Writer) *loader {
	l := newLoader(urls[0], progress)
	l.posts = urls
	return l
}

// postURL is the trips service replica that books trip i.
func (l *loader) postURL(i int64) string {
	if len(l.posts) == 0 {
		return l.url
	}
	return l.posts[int(i%int64(len(l.posts)))]
}

// tripBody is a trip a month from today, for two nights with a car.
func tripBody(i int64) []byte {
	in := time.Now().UTC().AddDate(0, 0, 30)
	req := events.TripRequest{
		Traveler: events.Person{Name: "Bench Traveler", Email: fmt.Sprintf("bench%d@example.com", i)},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: "tok_bench", AmountCents: 33000, Currency: "USD"},
	}
	b, _ := json.Marshal(req)
	return b
}

// result of one request: the trip's id and status, or why there is none.
type result struct {
	tripID, status, errReason string
	reason                    string // the trip's reason, when canceled
	lat                       time.Duration
	at                        time.Time
}

// book sends one POST /trips with Prefer: wait=60.
func (l *loader) book(ctx context.Context) result {
	i := l.seq.Add(1)
	return l.bookBody(ctx, i, tripBody(i))
}

// bookBody sends body as trip i of the run.
func (l *loader) bookBody(ctx context.Context, i int64, body []byte) result {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, l.postURL(i)+"/trips", bytes.NewReader(body))
	if err != nil {
		return result{errReason: "request: " + err.Error()}
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Prefer", "wait=60")
	hr.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", l.run, i))
	t0 := time.Now()
	resp, err := l.client.Do(hr)
	if err != nil {
		return result{errReason: errorReason(err), lat: time.Since(t0), at: time.Now()}
	}
	defer resp.Body.Close()
	var trip struct {
		TripID string `json:"trip_id"`
		Status string `json:"status"`
		Reason string `json:"reason"`
	}
	derr := json.NewDecoder(resp.Body).Decode(&trip)
	_, _ = io.Copy(io.Discard, resp.Body)
	r := result{lat: time.Since(t0), at: time.Now()}
	switch {
	case resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted:
		r.errReason = fmt.Sprintf("HTTP %d", resp.StatusCode)
	case derr != nil || trip.TripID == "":
		r.errReason = fmt.Sprintf("HTTP %d with an unreadable trip", resp.StatusCode)
	default:
		r.tripID, r.status, r.reason = trip.TripID, trip.Status, trip.Reason
	}
	return r
}

// errorReason names a transport error without its addresses, so that equal
// causes count together.
func errorReason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed without an answer"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

// collector gathers the results of one run.
type collector struct {
	mu       sync.Mutex
	run      *LoadRun
	statuses map[string]int
	errs     map[string]int
	lat      []time.Duration
	pending  []string // answered 202
	last     time.Time
	bar      *progressbar.ProgressBar
}

func (l *loader) newCollector(run *LoadRun, n int, desc string) *collector {
	c := &collector{run: run, statuses: map[string]int{}, errs: map[string]int{}}
	if l.progress != nil {
		c.bar = progressbar.NewOptions(n, progressbar.OptionSetWriter(l.progress), progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	}
	return c
}

func (c *collector) add(r result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.at.After(c.last) {
		c.last = r.at
	}
	if c.bar != nil {
		_ = c.bar.Add(1)
	}
	if r.errReason != "" {
		c.errs[r.errReason]++
		return
	}
	c.lat = append(c.lat, r.lat)
	c.run.samples = append(c.run.samples, sample{at: r.at, lat: r.lat})
	c.run.tripIDs = append(c.run.tripIDs, r.tripID)
	if r.status == "pending" || r.status == "canceling" {
		c.pending = append(c.pending, r.tripID)
		return
	}
	c.statuses[r.status]++
}

// finish fills the run's figures; pending trips (answered 202) are asked
// again by GET /trips/{id} until final.
func (c *collector) finish(ctx context.Context, l *loader) {
	if c.bar != nil {
		_ = c.bar.Finish()
	}
	for _, id := range c.pending {
		c.statuses[l.finalStatus(ctx, id)]++
	}
	r := c.run
	r.Answers = counts(c.statuses)
	r.Errors = counts(c.errs)
	r.Confirmed = c.statuses["confirmed"]
	if !c.last.IsZero() {
		r.DurationS = round(c.last.Sub(r.start).Seconds(), 3)
		if r.DurationS > 0 {
			r.AchievedPerS = round(float64(r.Confirmed)/r.DurationS, 1)
		}
	}
	r.Answer = percentiles(c.lat)
}

// finalStatus polls GET /trips/{id} until the trip is confirmed or canceled
// (at most 2 minutes); it returns the last status seen, or "unknown".
func (l *loader) finalStatus(ctx context.Context, id string) string {
	status := "unknown"
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if s, err := l.tripStatus(ctx, id); err == nil {
			status = s
			if s == "confirmed" || s == "canceled" {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return status
}

func (l *loader) tripStatus(ctx context.Context, id string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url+"/trips/"+url.PathEscape(id), nil)
	if err != nil {
		return "", err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var t struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		return "", fmt.Errorf("trip %s: %w", id, err)
	}
	return t.Status, nil
}

// unsettled returns how many trips the trips API lists as pending or
// canceling (stopping at 1 each: it asks for one item).
func (l *loader) unsettled(ctx context.Context) (int, error) {
	n := 0
	for _, s := range []string{"pending", "canceling"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url+"/trips?limit=1&status="+s, nil)
		if err != nil {
			return 0, err
		}
		resp, err := l.client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("bench: list %s trips: %w", s, err)
		}
		var page struct {
			Items []json.RawMessage `json:"items"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("bench: list %s trips: HTTP %d: %v", s, resp.StatusCode, err)
		}
		n += len(page.Items)
	}
	return n, nil
}

// closedLoop books n trips from clients clients, each booking one trip
// after another.
func (l *loader) closedLoop(ctx context.Context, n, clients int) *LoadRun {
	run := &LoadRun{Mode: "closed", Clients: clients, Trips: n}
	c := l.newCollector(run, n, fmt.Sprintf("closed loop, %d clients", clients))
	var next atomic.Int64
	run.start = time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				c.add(l.book(ctx))
			}
		})
	}
	wg.Wait()
	c.finish(ctx, l)
	return run
}

// openLoop sends trips at rate trips/s for d, each without waiting for the
// others' answers (at most 4,096 in flight).
func (l *loader) openLoop(ctx context.Context, rate float64, d time.Duration, pct int) *LoadRun {
	n := max(1, int(rate*d.Seconds()))
	run := &LoadRun{Mode: "open", OfferedPercent: pct, OfferedPerS: round(rate, 1), Trips: n}
	c := l.newCollector(run, n, fmt.Sprintf("open loop, %.0f trips/s", rate))
	sem := make(chan struct{}, 4096)
	run.start = time.Now()
	var wg sync.WaitGroup
	for i := range n {
		at := run.start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if w := time.Until(at); w > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w):
			}
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.add(l.book(ctx))
		})
	}
	wg.Wait()
	c.finish(ctx, l)
	return run
}
