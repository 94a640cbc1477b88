package reconciler

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/tripsaga/tripsaga/process"
)

// registerTripList mounts the trip list:
//
//	GET /api/trips   JSON [TripPage]: the trips a filter matches, a page at a time
//	GET /trips       HTML: the same, with the filter form and the bulk actions
//
// Both take the [TripFilter] fields as query parameters (status, step,
// state, company, min_attempts, error, paused, finding, version, min_age, from,
// to), and order (oldest, newest: by the first event; default newest),
// limit (1 to [MaxTripPage], default [DefaultTripPage]), cursor (a page's
// next_cursor) and, for the JSON, count=1 to get the filter's count. A
// bad parameter answers 400 naming it.
func (r *Reconciler) registerTripList(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/trips", r.serveTripList)
	mux.HandleFunc("GET /trips", r.serveTripListPage)
}

// tripListRequest is a list request's parameters.
type tripListRequest struct {
	Filter TripFilter
	Order  TripOrder
	Cursor string
	Limit  int
}

func parseTripListRequest(q url.Values) (tripListRequest, error) {
	lr := tripListRequest{Order: Newest, Limit: DefaultTripPage, Cursor: q.Get("cursor")}
	for k := range q {
		if !slices.Contains(filterKeys, k) && !slices.Contains(listKeys, k) {
			return lr, fmt.Errorf("%s: not a parameter of the trip list (those are %s)", k, strings.Join(append(slices.Clone(filterKeys), listKeys...), ", "))
		}
	}
	var err error
	if lr.Filter, err = parseFilterValues(q); err != nil {
		return lr, err
	}
	switch o := q.Get("order"); o {
	case "", string(Newest):
	case string(Oldest):
		lr.Order = Oldest
	default:
		return lr, errors.New("order: oldest or newest (by the trip's first event)")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxTripPage {
			return lr, errors.New("limit: a whole number from 1 to " + strconv.Itoa(MaxTripPage))
		}
		lr.Limit = n
	}
	if lr.Cursor != "" {
		if _, _, err := decodeCursor(lr.Cursor); err != nil {
			return lr, err
		}
	}
	return lr, nil
}

func badQuery(w http.ResponseWriter, req *http.Request, err error) {
	process.WriteProblem(w, process.Problem{Type: process.ProblemInvalidInput, Title: "Invalid query", Status: http.StatusBadRequest,
		Detail: err.Error(), Instance: req.URL.EscapedPath()})
}

func (r *Reconciler) serveTripList(w http.ResponseWriter, req *http.Request) {
	lr, err := parseTripListRequest(req.URL.Query())
	if err != nil {
		badQuery(w, req, err)
		return
	}
	page, err := r.ListTrips(req.Context(), lr.Filter, lr.Order, lr.Cursor, lr.Limit, req.URL.Query().Get("count") == "1")
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: trip list", err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// tripListPage is the data of the trip list page.
type tripListPage struct {
	tripListRequest
	Page  TripPage
	Query string // the filter as a query string, for links
	// NextURL is the next page's link, "" on the last.
	NextURL string
	States  []string
	Kinds   []string
	Err     string
}

func (r *Reconciler) serveTripListPage(w http.ResponseWriter, req *http.Request) {
	p := tripListPage{States: openStates, Kinds: FindingKinds}
	lr, err := parseTripListRequest(req.URL.Query())
	p.tripListRequest = lr
	status := http.StatusOK
	if err != nil {
		p.Err, status = err.Error(), http.StatusBadRequest
	} else {
		p.Page, err = r.ListTrips(req.Context(), lr.Filter, lr.Order, lr.Cursor, lr.Limit, true)
		if err != nil {
			process.WriteError(w, req, r.log, "reconciler: trip list", err)
			return
		}
		q := lr.Filter.Query()
		q.Set("order", string(lr.Order))
		p.Query = q.Encode()
		if p.Page.Next != "" {
			q.Set("cursor", p.Page.Next)
			q.Set("limit", strconv.Itoa(lr.Limit))
			p.NextURL = "/trips?" + q.Encode()
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := r.pages.ExecuteTemplate(w, "triplist", p); err != nil {
		r.log.Warn("reconciler: trip list render", "err", err)
	}
}

// tripListPages are the trip list's templates, parsed into the console's
// (consolePagesOf).
const tripListPages = `
{{define "triplist"}}{{template "head" "trips"}}
<h1>Trips</h1>
<form id="filter" method="get" action="/trips" class="ops">
status <select name="status" id="f-status"><option value="">any</option>{{range $s := statuses}}<option{{if eq $s $.Filter.Status}} selected{{end}}>{{$s}}</option>{{end}}</select>
open step <input name="step" id="f-step" size="8" value="{{.Filter.Step}}" placeholder="payment">
state <select name="state" id="f-state"><option value="">any</option>{{range .States}}<option{{if eq . $.Filter.State}} selected{{end}}>{{.}}</option>{{end}}</select>
company <select name="company" id="f-company"><option value="">any</option>{{range actors}}<option{{if eq . $.Filter.Company}} selected{{end}}>{{.}}</option>{{end}}</select>
attempts ≥ <input name="min_attempts" id="f-attempts" size="3" value="{{if .Filter.MinAttempts}}{{.Filter.MinAttempts}}{{end}}">
last error has <input name="error" id="f-error" size="14" value="{{.Filter.Error}}">
paused <select name="paused" id="f-paused"><option value="">either</option><option{{if eq .Filter.Paused "true"}} selected{{end}}>true</option><option{{if eq .Filter.Paused "false"}} selected{{end}}>false</option></select>
finding <select name="finding" id="f-finding"><option value="">any</option>{{range .Kinds}}<option{{if eq . $.Filter.Finding}} selected{{end}}>{{.}}</option>{{end}}</select>
version <input name="version" id="f-version" size="14" value="{{.Filter.Version}}" placeholder="hotel,payment,car">
older than <input name="min_age" id="f-age" size="5" value="{{if .Filter.MinAge}}{{.Filter.MinAge}}{{end}}" placeholder="10m">
from <input name="from" id="f-from" size="20" value="{{if not .Filter.From.IsZero}}{{.Filter.From.Format "2006-01-02T15:04:05Z07:00"}}{{end}}" placeholder="RFC 3339">
to <input name="to" id="f-to" size="20" value="{{if not .Filter.To.IsZero}}{{.Filter.To.Format "2006-01-02T15:04:05Z07:00"}}{{end}}">
order <select name="order" id="f-order"><option{{if eq .Order "newest"}} selected{{end}}>newest</option><option{{if eq .Order "oldest"}} selected{{end}}>oldest</option></select>
<button id="apply">filter</button> <a href="/trips">clear</a></form>
{{if .Err}}<p id="filter-error" class="half">{{.Err}}</p>{{else}}
<p><b id="match-count">{{with .Page.Count}}{{.}}{{end}}</b> trips match <code id="match-filter">{{.Filter}}</code> · <a href="/api/trips?{{.Query}}&count=1">JSON</a></p>
` + bulkForm + `
<table id="trips"><tr><th>trip</th><th>status</th><th>age</th><th>open step</th><th>state</th><th>attempts</th><th>last error</th><th>findings</th><th>version</th></tr>
{{range .Page.Items}}<tr class="trip" data-trip="{{.TripID}}"><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td class="{{.Status}}">{{.Status}}</td><td>{{ms (msd .AgeMs)}}</td>
{{with .OpenStep}}<td>{{.Company}}: {{.Step}}</td><td>{{.State}}{{if .Paused}} <b class="paused">paused</b>{{end}}</td><td>{{.Attempts}}</td><td>{{visible .LastError}}</td>{{else}}<td colspan="4">none unfinished</td>{{end}}
<td>{{range .Findings}}<span class="{{.}}">{{.}}</span> {{end}}</td><td><code>{{.Version}}</code></td></tr>
{{else}}<tr><td colspan="9">No trip matches.</td></tr>{{end}}</table>
{{with .NextURL}}<p><a id="next" href="{{.}}">next page</a></p>{{end}}{{end}}
` + consoleScript + bulkScript + `</body></html>{{end}}
`
