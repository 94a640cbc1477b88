package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// Register mounts the dashboard on mux:
//
//	GET /                 HTML: trips by status, open findings, newest 50 trips
//	GET /findings         JSON {"items":[Finding...]}: open findings; ?all=1 adds resolved ones
//	GET /view/{trip_id}   JSON: the trip's [TripView] plus "findings"; 404 problem+json if unknown
//
// An id that cannot be a trip (events.ValidateTripID: a NUL, a byte that
// is not UTF-8, a space, ...) is 404 without a look-up; PostgreSQL
// unreachable is 503 problem+json with Retry-After (process.WriteError).
func (r *Reconciler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", r.serveDashboard)
	mux.HandleFunc("GET /findings", r.serveFindings)
	mux.HandleFunc("GET /view/{trip_id}", r.serveView)
	r.registerConsole(mux)
	r.registerSwimlanes(mux)
}

// Dashboard is the data of the HTML page.
type Dashboard struct {
	Now       time.Time
	Total     int
	ByStatus  []StatusCount
	Findings  []Finding
	Trips     []TripView
	LastSweep *SweepResult
	// Console is the operator's console part (search, figures, chart),
	// rendered by console.go.
	Console template.HTML
}

// StatusCount is the number of trips in one status.
type StatusCount struct {
	Status string
	Trips  int
}

// dashboardTrips is how many trips the page lists, newest first.
const dashboardTrips = 50

// Dashboard gathers the page's data.
func (r *Reconciler) Dashboard(ctx context.Context) (Dashboard, error) {
	d := Dashboard{Now: time.Now().UTC(), LastSweep: r.LastSweep()}
	counts, err := queries.TripViewCountByStatus(ctx, r.cfg.Pool)
	if err != nil {
		return d, fmt.Errorf("dashboard: counts: %w", err)
	}
	got := map[string]int{}
	for _, c := range counts {
		got[c.Status] = int(c.Trips)
		d.Total += int(c.Trips)
	}
	for _, s := range statuses {
		d.ByStatus = append(d.ByStatus, StatusCount{s, got[s]})
	}
	if d.Findings, err = r.Findings(ctx, false); err != nil {
		return d, err
	}
	rows, err := queries.TripViewListNewest(ctx, r.cfg.Pool, dashboardTrips)
	if err != nil {
		return d, fmt.Errorf("dashboard: trips: %w", err)
	}
	for _, row := range rows {
		d.Trips = append(d.Trips, tripViewFromRow(row))
	}
	return d, nil
}

func (r *Reconciler) serveDashboard(w http.ResponseWriter, req *http.Request) {
	d, err := r.Dashboard(req.Context())
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: dashboard", err)
		return
	}
	d.Console = r.renderConsole(req)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := page.Execute(w, d); err != nil {
		r.log.Warn("reconciler: dashboard render", "err", err)
	}
}

func (r *Reconciler) serveFindings(w http.ResponseWriter, req *http.Request) {
	all := req.URL.Query().Get("all")
	fs, err := r.Findings(req.Context(), all == "1" || all == "true")
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: findings", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": fs})
}

func (r *Reconciler) serveView(w http.ResponseWriter, req *http.Request) {
	trip := req.PathValue("trip_id")
	if events.ValidateTripID(trip) != nil {
		process.WriteNotFound(w, req, "Trip not found: not a trip id")
		return
	}
	v, err := r.View(req.Context(), trip)
	if errors.Is(err, ErrTripNotFound) {
		process.WriteNotFound(w, req, "Trip not found")
		return
	}
	var rows []dbsqlc.Finding
	if err == nil {
		rows, err = queries.FindingListByTrip(req.Context(), r.cfg.Pool, trip)
	}
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: view "+trip, err)
		return
	}
	fs := make([]Finding, 0, len(rows))
	for _, row := range rows {
		fs = append(fs, findingFromRow(row))
	}
	writeJSON(w, http.StatusOK, struct {
		TripView
		Findings []Finding `json:"findings"`
	}{v, fs})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

var page = template.Must(template.New("dashboard").Funcs(template.FuncMap{ //nolint:gochecknoglobals // parsed once, read-only
	"visible": events.Visible, // a company's words shown, not obeyed
	"ago":     func(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() },
}).Parse(liveTemplate + `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tripsaga reconciler</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin-bottom:1.5rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f3f3}
.pending{color:#946200}.canceling{color:#b34700}.confirmed{color:#1a7f37}.canceled{color:#555}
.half,.orphan{color:#b00020;font-weight:bold}.stuck{color:#b34700;font-weight:bold}
code{font-size:.8rem}
</style></head><body>
<h1>tripsaga reconciler</h1>
{{template "live" .Now}}
<h2>Open findings ({{len .Findings}})</h2>
{{if .Findings}}<table><tr><th>trip</th><th>kind</th><th>detail</th><th>first seen</th><th>last seen</th></tr>
{{range .Findings}}<tr><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td class="{{.Kind}}">{{.Kind}}</td><td>{{visible .Detail}}</td><td>{{ago $.Now .FirstSeen}} ago</td><td>{{ago $.Now .LastSeen}} ago</td></tr>
{{end}}</table>{{else}}<p>None.</p>{{end}}
{{.Console}}
<table class="summary">
<tr><th>trips in the projection now</th><td>{{.Total}}</td><td>every trip whose events the reconciler has seen</td></tr>
{{with .LastSweep}}<tr><th>last sweep</th><td>{{ago $.Now .At}} ago</td><td>{{if .Skipped}}skipped: {{.SkippedFor}}{{else if .Err}}<b>failed</b>: {{.Err}}{{else}}ok{{end}}</td></tr>
<tr><th>trips the last sweep checked</th><td>{{.Trips}}</td><td>the projection as it was when that sweep started</td></tr>
<tr><th>company records the last sweep read</th><td>{{.Records}}</td><td>the hotel's holds, the card processor's charges and the car firm's bookings, all statuses</td></tr>
{{else}}<tr><th>last sweep</th><td>none yet</td><td></td></tr>{{end}}
</table>
<h2>Trips by status</h2>
<table><tr>{{range .ByStatus}}<th class="{{.Status}}">{{.Status}}</th>{{end}}</tr>
<tr>{{range .ByStatus}}<td>{{.Trips}}</td>{{end}}</tr></table>
<h2>Newest trips</h2>
<table><tr><th>trip</th><th>status</th><th>events seen</th><th>first event</th><th>last event</th></tr>
{{range .Trips}}<tr><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td class="{{.Status}}">{{.Status}}{{if .Mailed}} ✉{{end}}</td><td>{{range $i, $k := .Seen}}{{if $i}}, {{end}}<code>{{$k}}</code>{{end}}</td><td>{{.FirstEventAt.Format "2006-01-02 15:04:05"}}</td><td>{{ago $.Now .LastEventAt}} ago</td></tr>
{{end}}</table>
<p><a href="/findings">/findings</a> · <a href="/findings?all=1">all findings</a> · <a href="/metrics">/metrics</a></p>
</body></html>
`))
