package reconciler

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/saga"
)

// registerConsole mounts the operator's console on mux:
//
//	GET /trips/{trip_id}               HTML: the trip's timeline, with the action buttons
//	GET /api/trips/{trip_id}/timeline  JSON: [Timeline]
//	GET /search?q=                     HTML: the trips q finds; one trip redirects (303) to its timeline
//	GET /api/search?q=                 JSON {"items":[SearchHit...],"unread":[...]}
//	GET /incidents                     HTML: every service's incidents, open first
//	GET /api/incidents                 JSON {"items":[ServiceIncident...],"unread":[...]}
//	GET /deadletters                   HTML: the parked events (the newest 1000), each with its re-drive button
//	GET /api/figures                   JSON: [Figures]
//	GET /chart.svg                     the dashboard's chart of the last hour
//
// and the trip list (registerTripList).
//
// Reading needs no token. The buttons POST to /api/actions (the operator
// actions, which need OPERATOR_TOKEN) from the browser.
func (r *Reconciler) registerConsole(mux *http.ServeMux) {
	mux.HandleFunc("GET /trips/{trip_id}", r.serveTimelinePage)
	mux.HandleFunc("GET /api/trips/{trip_id}/timeline", r.serveTimeline)
	mux.HandleFunc("GET /search", r.serveSearchPage)
	mux.HandleFunc("GET /api/search", r.serveSearch)
	mux.HandleFunc("GET /incidents", r.serveIncidentsPage)
	mux.HandleFunc("GET /api/incidents", r.serveIncidents)
	mux.HandleFunc("GET /deadletters", r.serveDeadLettersPage)
	mux.HandleFunc("GET /api/figures", r.serveFigures)
	mux.HandleFunc("GET /chart.svg", r.serveChart)
	r.registerTripList(mux)
}

func (r *Reconciler) serveTimeline(w http.ResponseWriter, req *http.Request) {
	trip := req.PathValue("trip_id")
	if events.ValidateTripID(trip) != nil {
		process.WriteNotFound(w, req, "Trip not found: not a trip id")
		return
	}
	t, err := r.Timeline(req.Context(), trip)
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: timeline "+trip, err)
		return
	}
	if t.unknown() {
		process.WriteNotFound(w, req, "Trip not found")
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// unknown reports whether nothing at all is known of t's trip: no view,
// no entry, no finding and no record at any company (the timeline then
// answers 404).
func (t Timeline) unknown() bool {
	if t.View != nil || len(t.Entries) > 0 || len(t.Findings) > 0 {
		return false
	}
	for _, r := range t.Records {
		if r.Record != nil {
			return false
		}
	}
	return true
}

// timelinePage is the data of the timeline page.
type timelinePage struct {
	Timeline
	Rows []timelineRow
}

// timelineRow is one entry placed in its column.
type timelineRow struct {
	Entry
	Since time.Duration
	Cells []bool // true in the entry's column
}

func (r *Reconciler) serveTimelinePage(w http.ResponseWriter, req *http.Request) {
	trip := req.PathValue("trip_id")
	if events.ValidateTripID(trip) != nil {
		process.WriteNotFound(w, req, "Trip not found: not a trip id")
		return
	}
	t, err := r.Timeline(req.Context(), trip)
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: timeline "+trip, err)
		return
	}
	p := timelinePage{Timeline: t}
	var first time.Time
	if len(t.Entries) > 0 {
		first = t.Entries[0].At
	}
	for _, e := range t.Entries {
		row := timelineRow{Entry: e, Since: e.At.Sub(first).Round(time.Millisecond), Cells: make([]bool, len(t.Columns))}
		for i, c := range t.Columns {
			row.Cells[i] = c == e.Column
		}
		p.Rows = append(p.Rows, row)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if t.unknown() {
		w.WriteHeader(http.StatusNotFound)
	}
	if err := r.pages.ExecuteTemplate(w, "timeline", p); err != nil {
		r.log.Warn("reconciler: timeline render", "err", err)
	}
}

func (r *Reconciler) serveSearch(w http.ResponseWriter, req *http.Request) {
	q := strings.TrimSpace(req.URL.Query().Get("q"))
	if q == "" {
		process.WriteProblem(w, process.Problem{Type: "about:blank", Title: "Invalid query", Status: http.StatusBadRequest,
			Detail: "q: give a trip id, an Idempotency-Key, a traveler's email or a company record id"})
		return
	}
	if err := searchable(q); err != nil {
		process.WriteProblem(w, process.Problem{Type: "about:blank", Title: "Invalid query", Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	hits, unread := r.Search(req.Context(), q)
	writeJSON(w, http.StatusOK, map[string]any{"items": hits, "unread": unread})
}

func (r *Reconciler) serveSearchPage(w http.ResponseWriter, req *http.Request) {
	q := strings.TrimSpace(req.URL.Query().Get("q"))
	var hits []SearchHit
	var unread []string
	if q != "" {
		hits, unread = r.Search(req.Context(), q)
		if len(hits) == 1 {
			http.Redirect(w, req, "/trips/"+url.PathEscape(hits[0].TripID), http.StatusSeeOther)
			return
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := r.pages.ExecuteTemplate(w, "search", map[string]any{"Q": q, "Hits": hits, "Unread": unread}); err != nil {
		r.log.Warn("reconciler: search render", "err", err)
	}
}

func (r *Reconciler) serveIncidents(w http.ResponseWriter, req *http.Request) {
	items, unread := r.Incidents(req.Context())
	writeJSON(w, http.StatusOK, map[string]any{"items": items, "unread": unread})
}

// incidentRow is an incident on the incidents page.
type incidentRow struct {
	ServiceIncident
	Age        time.Duration
	RetryKey   string
	ResolveKey string
}

// incidentsPageResolved is how many resolved incidents the incidents page
// lists after the open ones (the JSON has them all).
const incidentsPageResolved = 200

func incidentRows(items []ServiceIncident, now time.Time) []incidentRow {
	out := make([]incidentRow, 0, len(items))
	resolved := 0
	for _, in := range items {
		if in.ResolvedAt != nil {
			resolved++
		}
	}
	// The oldest resolved ones beyond the limit are left out.
	skip := max(resolved-incidentsPageResolved, 0)
	for _, in := range items {
		if in.ResolvedAt != nil && skip > 0 { // items are open first, then oldest first
			skip--
			continue
		}
		out = append(out, incidentRow{ServiceIncident: in, Age: now.Sub(in.RaisedAt).Round(time.Second),
			RetryKey: newKey(), ResolveKey: newKey()})
	}
	return out
}

func (r *Reconciler) serveIncidentsPage(w http.ResponseWriter, req *http.Request) {
	items, unread := r.Incidents(req.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	rows := incidentRows(items, time.Now())
	data := map[string]any{"Items": rows, "Unread": unread, "Hidden": len(items) - len(rows)}
	if err := r.pages.ExecuteTemplate(w, "incidents", data); err != nil {
		r.log.Warn("reconciler: incidents render", "err", err)
	}
}

// deadLetterRow is a parked event on the dead letters page.
type deadLetterRow struct {
	DeadLetter
	Key     string
	Headers string
}

func (r *Reconciler) serveDeadLettersPage(w http.ResponseWriter, req *http.Request) {
	dls, err := (&Operator{r: r}).DeadLetters(req.Context()) // the read side of the actions' API
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: dead letters", err)
		return
	}
	rows := make([]deadLetterRow, 0, len(dls))
	for i := len(dls) - 1; i >= 0; i-- { // newest first
		h, _ := json.MarshalIndent(dls[i].Headers, "", "  ")
		rows = append(rows, deadLetterRow{DeadLetter: dls[i], Key: newKey(), Headers: string(h)})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := r.pages.ExecuteTemplate(w, "deadletters", map[string]any{"Items": rows}); err != nil {
		r.log.Warn("reconciler: dead letters render", "err", err)
	}
}

func (r *Reconciler) serveFigures(w http.ResponseWriter, req *http.Request) {
	f, err := r.Figures(req.Context())
	if err != nil {
		process.WriteError(w, req, r.log, "reconciler: figures", err)
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (r *Reconciler) serveChart(w http.ResponseWriter, _ *http.Request) {
	answers, unfinished := r.figures.snapshot()
	w.Header().Set("Content-Type", "image/svg+xml")
	_, _ = w.Write([]byte(renderChart(answers, unfinished, time.Now().UTC())))
}

// consoleData is the console part of the dashboard.
type consoleData struct {
	Figures *Figures
	Chart   template.HTML
}

// console gathers the dashboard's figures and chart; a failure is shown
// on the page rather than failing it.
func (r *Reconciler) console(req *http.Request) consoleData {
	d := consoleData{}
	if f, err := r.Figures(req.Context()); err == nil {
		d.Figures = &f
	} else {
		r.log.Warn("reconciler: figures", "err", err)
	}
	answers, unfinished := r.figures.snapshot()
	now := time.Now().UTC()
	if d.Figures != nil { // the line ends at what the page shows now
		unfinished = append(unfinished, sample{now, float64(d.Figures.Unfinished)})
	}
	d.Chart = renderChart(answers, unfinished, now)
	return d
}

func newKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "console-" + hex.EncodeToString(b[:])
}

func jsonAttr(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

var consoleFuncs = template.FuncMap{ //nolint:gochecknoglobals // read-only
	"visible": events.Visible, // a name or reason shown, not obeyed
	"ms":      func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"age":     func(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() },
	"json":    jsonAttr,
	"key":     newKey,
	"pretty": func(raw json.RawMessage) string {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return string(raw)
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		return string(b)
	},
	"split":          strings.Split,
	"statuses":       func() []string { return statuses },
	"msd":            func(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond },
	"bulkActions":    func() []string { return BulkActions },
	"bulkTripStates": func() []string { return bulkTripStates },
	"add":            func(a, b, c int) int { return a + b + c },
	// actors and owner are the catalogue's: [consolePagesOf] sets them.
	"actors": func() []string { return nil },
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
	"swimlanes": renderSwimlanes,
	"open": func(fs []Finding) []Finding {
		var out []Finding
		for _, f := range fs {
			if f.ResolvedAt == nil && f.DismissedAt == nil {
				out = append(out, f)
			}
		}
		return out
	},
	"dismissed": func(fs []Finding) []Finding {
		var out []Finding
		for _, f := range fs {
			if f.ResolvedAt == nil && f.DismissedAt != nil {
				out = append(out, f)
			}
		}
		return out
	},
	"settles": settleOutcomes,
	"todo":    FindingToDo,
	"owner":   func(step string) string { return step },
}

// findingToDo is what an operator does about each kind of finding
// (docs/console.md's table, in one sentence each).
var findingToDo = map[string]string{ //nolint:gochecknoglobals // read-only
	FindingStuck:        "read where it stopped above: an open incident (fix the company side, then retry now), a parked event (fix what its reason says, then re-drive it), or a consumer that lags (is its process up?)",
	FindingHalf:         "compare the records below with the events: a record in force that should not be is a leak, undo the leak at its service; a record missing on a confirmed trip needs a person (rebook, or cancel and refund by hand)",
	FindingOrphan:       "search the record's id: if no trip owns it, undo the leak at its service; if one does, the view is behind (consumer lag) or was rebuilt (tripsaga replay reconciler)",
	FindingOpenUndo:     "fix the company side and retry now, or do the undo by hand and settle it undone: the trip then settles canceled, one mail",
	FindingUnattributed: "look the record up at the company by its id, and undo it there by its key if it is a leak: no trip can own it",
}

// FindingToDo returns what an operator does about a finding of kind, in
// one sentence ("" for a kind it does not know).
func FindingToDo(kind string) string { return findingToDo[kind] }

// consolePagesOf returns the console's pages for a system running
// catalogue c: who carries out actions ("actors") and which service owns
// a step ("owner") are c's.
func consolePagesOf(c events.Catalogue) *template.Template {
	pages := template.Must(consolePages.Clone()).Funcs(template.FuncMap{
		"actors": func() []string { return actionServices(c) },
		"owner": func(step string) string {
			if s, ok := c.Step(step); ok {
				return s.Service
			}
			return step
		},
	})
	return template.Must(pages.Parse(tripListPages + bulkPages))
}

// settleOutcomes are the outcomes a settle button of an incident of kind
// offers: undone for an undo's incident, done and not_done for a step
// stuck going forward, none for the others (a refused forward step is
// final already).
func settleOutcomes(kind string) []string {
	switch kind {
	case saga.IncidentCompensationStuck, saga.IncidentCompensationRefused, saga.IncidentCompensationAnswerMismatch:
		return []string{events.SettleUndone}
	case saga.IncidentForwardStuck, saga.IncidentForwardAnswerMismatch, saga.IncidentCompanyCredentials:
		return []string{events.SettleDone, events.SettleNotDone}
	}
	return nil
}

// consoleStyle and consoleScript are shared by the console's pages.
const consoleStyle = `<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin-bottom:1.5rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f3f3}
.pending{color:#946200}.canceling{color:#b34700}.confirmed{color:#1a7f37}.canceled{color:#555}
.half,.orphan,.unattributed{color:#b00020;font-weight:bold}.stuck{color:#b34700;font-weight:bold}
.stopped{font-size:1.05rem;padding:.5rem .75rem;background:#fff7e0;border-left:4px solid #e0a800;margin:.5rem 0 1rem}
.settled{background:#eaf7ee;border-color:#1a7f37}
.ev{color:#0b5cad}.step{color:#333}.incident{color:#b00020}.deadletter{color:#8a2be2}.operator{color:#0b7a75}
td.cell{min-width:7rem;max-width:18rem;overflow-wrap:anywhere}.scroll{overflow-x:auto;max-width:100%}.what{font-weight:600}.detail{color:#555;font-size:.8rem}
.ops{background:#f6f8fa;padding:.5rem .75rem;margin:.5rem 0 1rem;border:1px solid #ddd}
.ops input{margin-right:.5rem}#action-result{font-family:monospace;font-size:.8rem;white-space:pre-wrap}
button{cursor:pointer}code,pre{font-size:.8rem}pre{margin:0;max-width:28rem;overflow:auto}
nav a{margin-right:1rem}
</style>`

const consoleScript = `<script>
(function(){
  var t=document.getElementById('token'), o=document.getElementById('operator');
  if(t){t.value=sessionStorage.getItem('tripsaga-token')||''; t.addEventListener('change',function(){sessionStorage.setItem('tripsaga-token',t.value)});}
  if(o){o.value=sessionStorage.getItem('tripsaga-operator')||o.value; o.addEventListener('change',function(){sessionStorage.setItem('tripsaga-operator',o.value)});}
})();
function act(btn){
  var out=document.getElementById('action-result');
  var token=document.getElementById('token').value.trim();
  if(!token){out.textContent='An operator token (OPERATOR_TOKEN) is needed to act.';return;}
  sessionStorage.setItem('tripsaga-token',token);
  var body=JSON.parse(btn.dataset.body);
  body.reason=document.getElementById('reason').value.trim();
  body.operator=document.getElementById('operator').value.trim()||'operator';
  if(!body.reason&&!btn.dataset.needsReason){body.reason=btn.textContent.trim()+' (asked on the console)';}
  if(!body.reason){out.textContent='Give a reason first: it is kept with the action.';return;}
  btn.disabled=true;
  fetch('/api/actions',{method:'POST',headers:{'Authorization':'Bearer '+token,'Idempotency-Key':btn.dataset.key,'Content-Type':'application/json'},body:JSON.stringify(body)})
    .then(function(r){return r.text().then(function(txt){
      out.textContent=r.status+' '+txt; out.dataset.status=r.status;
      if(r.ok){setTimeout(function(){location.reload()},700)} else {btn.disabled=false}
    })})
    .catch(function(e){out.textContent='failed: '+e; btn.disabled=false});
}
</script>`

const opsBar = `<div class="ops">operator <input id="operator" size="12" value="operator">
token <input id="token" type="password" size="18" autocomplete="off" placeholder="OPERATOR_TOKEN">
reason <input id="reason" size="40" placeholder="why (kept on the trip's timeline)">
<div id="action-result"></div></div>`

const navBar = `<nav><a href="/">dashboard</a> · <a href="/trips" id="nav-trips">trips</a> · <a href="/bulk">bulk actions</a> · <a href="/incidents">incidents</a> · <a href="/deadletters">dead letters</a> · <a href="/findings">findings (JSON)</a> ·
<form action="/search" method="get" style="display:inline"><input name="q" id="q" size="36" placeholder="trip id, Idempotency-Key, email, record id"> <button id="search">find</button></form></nav>`

//nolint:gochecknoglobals // parsed once, read-only
var consolePages = template.Must(template.New("console").Funcs(consoleFuncs).Parse(liveTemplate + `
{{define "head"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.}} · tripsaga</title>` + consoleStyle + `</head><body>` + navBar + `{{end}}

{{define "timeline"}}{{template "head" (printf "trip %s" .TripID)}}
<h1>Trip <code id="trip-id">{{.TripID}}</code>{{with .View}} <span class="{{.Status}}" id="trip-status">{{.Status}}</span>{{end}}</h1>
{{template "live" .At}}
<div id="stopped" class="stopped{{with .View}}{{if .Settled}} settled{{end}}{{end}}"><b>Where it stopped:</b> {{.Stopped}}</div>
<p><b>Steps of this trip</b> (its version: the saga order it started under and is judged by): <code id="trip-version">{{.Version}}</code></p>
{{if .Unread}}<p><b>Not read</b> (this timeline is incomplete):</p><ul>{{range .Unread}}<li>{{.}}</li>{{end}}</ul>{{end}}
` + opsBar + `
{{$trip := .TripID}}<p>Retries of this trip: {{range actors}}<span class="svc">{{.}}:
<button class="action pause" data-service="{{.}}" data-key="{{key}}" data-body='{{json (dict "action" "pause" "trip" $trip "service" .)}}' onclick="act(this)">pause</button>
<button class="action resume" data-service="{{.}}" data-key="{{key}}" data-body='{{json (dict "action" "resume" "trip" $trip "service" .)}}' onclick="act(this)">resume</button></span> &nbsp; {{end}}
· <a href="/api/trips/{{.TripID}}/timeline">JSON</a></p>
<p id="redrive">Re-drive this trip's events from a step to the services that consume them (through their inboxes: what a service handled already is dropped, so nothing acts twice):
<select id="redrive-step">{{range split .Version ","}}<option>{{.}}</option>{{end}}</select>
<button class="redrive-dry" type="button" onclick="redriveFrom(true)">dry run</button>
<button class="redrive-run" type="button" data-key="{{key}}" onclick="redriveFrom(false, this)">re-drive</button></p>
<div id="redrive-result"></div>
<script>
function redriveFrom(dry, btn){
  var out=document.getElementById('redrive-result');
  var body={step:document.getElementById('redrive-step').value,dry_run:dry,
    reason:document.getElementById('reason').value.trim(),operator:document.getElementById('operator').value.trim()||'operator'};
  var h={'Content-Type':'application/json'};
  if(!dry){
    var token=document.getElementById('token').value.trim();
    if(!token||!body.reason){out.textContent='The operator token and a reason are needed to re-drive.';return}
    h['Authorization']='Bearer '+token; h['Idempotency-Key']=btn.dataset.key;
  }
  fetch('/api/trips/{{.TripID}}/redrive',{method:'POST',headers:h,body:JSON.stringify(body)})
    .then(function(r){return r.json().then(function(d){
      out.dataset.status=r.status;
      if(!r.ok){out.textContent=r.status+' '+(d.detail||d.title);return}
      out.textContent=(dry?'dry run: ':'re-driven: ')+d.deliveries.length+' deliveries from '+d.step+': '+
        d.deliveries.map(function(x){return x.kind+' → '+x.consumer}).join(', ');
    })});
}
</script>
{{if .Incidents}}<h2>Incidents</h2>
<table id="incidents"><tr><th>step</th><th>kind</th><th>attempts</th><th>last error</th><th>raised</th><th>resolved</th><th></th></tr>
{{range .Incidents}}<tr><td>{{.Step}}</td><td class="incident">{{.Kind}}</td><td>{{.Calls}}{{if ne .Calls .Attempts}} ({{.Attempts}} when raised){{end}}</td><td>{{.LastError}}</td><td>{{.RaisedAt.Format "15:04:05.000"}}</td><td>{{if .ResolvedAt}}{{.ResolvedAt.Format "15:04:05.000"}}{{else}}open{{end}}</td>
<td>{{if not .ResolvedAt}}<button class="action retry" data-key="{{key}}" data-body='{{json (dict "action" "retry_undo" "trip" $trip "service" (owner .Step))}}' onclick="act(this)">retry now</button>
<button class="action resolve" data-needs-reason="1" data-key="{{key}}" data-body='{{json (dict "action" "resolve" "trip" $trip "service" (owner .Step) "incident" .Kind)}}' onclick="act(this)">resolve</button>
{{$inc := .}}{{range settles .Kind}}<button class="action settle" data-needs-reason="1" data-key="{{key}}" data-body='{{json (dict "action" "settle" "trip" $trip "service" (owner $inc.Step) "step" $inc.Step "outcome" .)}}' onclick="act(this)" title="a person did it by hand: the retries stop, its event is published">settle: {{.}} by hand</button> {{end}}{{end}}</td></tr>
{{end}}</table>{{end}}
{{with open .Findings}}<h2>Open findings</h2><table id="findings"><tr><th>kind</th><th>detail</th><th>first seen</th><th>what to do</th><th></th></tr>
{{range .}}<tr><td class="{{.Kind}}">{{.Kind}}</td><td>{{visible .Detail}}</td><td>{{.FirstSeen.Format "15:04:05"}}</td><td class="todo">{{todo .Kind}}</td>
<td>{{if or (eq .Kind "orphan") (eq .Kind "half")}}undo the leak at: {{range actors}}<button class="action undo-leak" data-needs-reason="1" data-key="{{key}}" data-body='{{json (dict "action" "undo_leak" "trip" $trip "service" .)}}' onclick="act(this)">{{.}}</button> {{end}}{{end}}
<button class="action dismiss" data-needs-reason="1" data-key="{{key}}" data-body='{{json (dict "action" "dismiss" "trip" .TripID "incident" .Kind)}}' onclick="act(this)" title="seen by a person: no longer counted as open while it holds">dismiss</button></td></tr>{{end}}</table>{{end}}
{{with dismissed .Findings}}<p id="dismissed">Dismissed, still holding: {{range .}}<span class="{{.Kind}}">{{.Kind}}</span> by {{.DismissedBy}} ({{.DismissReason}}) {{end}}</p>{{end}}
<h2>Timeline</h2>
<div class="scroll">{{swimlanes .Timeline}}</div>
<div class="scroll"><table id="timeline"><tr><th>time (UTC)</th><th>+</th>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}{{$e := .}}<tr class="entry {{.Source}}" data-column="{{.Column}}" data-what="{{.What}}"><td>{{.At.Format "15:04:05.000"}}</td><td>{{ms .Since}}</td>
{{range .Cells}}<td class="cell">{{if .}}<div class="what {{if eq $e.Source "event"}}ev{{else}}{{$e.Source}}{{end}}">{{$e.What}}</div>{{with $e.Detail}}<div class="detail">{{.}}</div>{{end}}
{{if eq $e.Source "deadletter"}}<button class="action redrive" data-key="{{key}}" data-needs-reason="1" data-body='{{json (dict "action" "redrive" "deadletter_seq" $e.Seq)}}' onclick="act(this)">re-drive</button>{{end}}{{end}}</td>{{end}}</tr>
{{else}}<tr><td colspan="{{len .Columns}}">No event, step or incident of this trip was found.</td></tr>{{end}}</table></div>
<h2>The companies' records now</h2>
<table id="records"><tr><th>company</th><th>key</th><th>record</th></tr>
{{range .Records}}<tr><td>{{.Company}} ({{.Resource}})</td><td>{{if .Key}}<code>{{.Key}}</code>{{if eq .KeyFrom "convention"}} (no step row read: asked by the step's key){{end}}{{else}}none to ask by{{end}}</td><td>{{if .Error}}not read: {{.Error}}{{else if .Record}}<b>{{index .Record "status"}}</b> <pre>{{json .Record}}</pre>{{else if .None}}none: the company has no record of this key{{else}}not asked{{end}}</td></tr>{{end}}</table>
{{if .Steps}}<h2>Step log</h2>
<table id="steps"><tr><th>step</th><th>status</th><th>outcome</th><th>company record</th><th>attempts</th><th>undo attempts</th><th>last error</th><th>created</th><th>finished</th><th>undone</th></tr>
{{range .Steps}}<tr><td>{{.Step}}</td><td>{{.Status}}</td><td>{{.Outcome}}</td><td>{{.CompanyRef}}</td><td>{{.Attempts}}</td><td>{{.UndoAttempts}}</td><td>{{.LastError}}</td><td>{{.CreatedAt.Format "15:04:05.000"}}</td><td>{{with .FinishedAt}}{{.Format "15:04:05.000"}}{{end}}</td><td>{{with .UndoneAt}}{{.Format "15:04:05.000"}}{{end}}</td></tr>{{end}}</table>{{end}}
` + consoleScript + `</body></html>{{end}}

{{define "search"}}{{template "head" "search"}}
<h1>Search{{with .Q}}: <code>{{.}}</code>{{end}}</h1>
{{if .Q}}{{if .Hits}}<table id="hits"><tr><th>trip</th><th>matched</th></tr>{{range .Hits}}<tr><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td>{{.Matched}}</td></tr>{{end}}</table>{{else}}<p id="no-hits">No trip matches.</p>{{end}}{{end}}
{{if .Unread}}<p>Not asked:</p><ul>{{range .Unread}}<li>{{.}}</li>{{end}}</ul>{{end}}
</body></html>{{end}}

{{define "incidents"}}{{template "head" "incidents"}}
<h1>Incidents across services</h1>
{{if .Unread}}<p><b>Not read</b>:</p><ul>{{range .Unread}}<li>{{.}}</li>{{end}}</ul>{{end}}
` + opsBar + `
<table id="incidents"><tr><th>service</th><th>trip</th><th>step</th><th>kind</th><th>attempts</th><th>last error</th><th>age</th><th>owner</th><th>escalates</th><th>resolved</th><th></th></tr>
{{range .Items}}<tr class="{{if .ResolvedAt}}resolved{{else}}open{{end}}"><td>{{.Service}}</td><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td>{{.Step}}</td><td class="incident">{{.Kind}}</td><td>{{.Calls}}{{if ne .Calls .Attempts}} ({{.Attempts}} when raised){{end}}</td><td>{{.LastError}}</td><td>{{.Age}}</td><td class="owner">{{.Owner}}</td><td class="escalation">{{if .Escalated}}<b>escalated</b> at {{.EscalatesAt.Format "15:04:05"}}{{else if .EscalatesAt}}at {{.EscalatesAt.Format "15:04:05"}}{{end}}</td><td>{{if .ResolvedAt}}{{.ResolvedAt.Format "15:04:05"}}{{else}}open{{end}}</td>
<td>{{if not .ResolvedAt}}<button class="action retry" data-key="{{.RetryKey}}" data-body='{{json (dict "action" "retry_undo" "trip" .TripID "service" .Service)}}' onclick="act(this)">retry now</button>
<button class="action resolve" data-needs-reason="1" data-key="{{.ResolveKey}}" data-body='{{json (dict "action" "resolve" "trip" .TripID "service" .Service "incident" .Kind)}}' onclick="act(this)">resolve</button>
{{$inc := .}}{{range settles .Kind}}<button class="action settle" data-needs-reason="1" data-key="{{key}}" data-body='{{json (dict "action" "settle" "trip" $inc.TripID "service" $inc.Service "step" $inc.Step "outcome" .)}}' onclick="act(this)" title="a person did it by hand: the retries stop, its event is published">settle: {{.}} by hand</button> {{end}}{{end}}</td></tr>
{{else}}<tr><td colspan="11">No incident.</td></tr>{{end}}</table>
{{if .Hidden}}<p>{{.Hidden}} older resolved incidents are not listed: <a href="/api/incidents">/api/incidents</a> has them all.</p>{{end}}
` + consoleScript + `</body></html>{{end}}

{{define "deadletters"}}{{template "head" "dead letters"}}
<h1>Dead letters ({{len .Items}})</h1>
<p>Events an inbox could not handle and parked on DEADLETTER, newest first. <b>Re-drive</b> hands one back to the consumer that parked it, and to no other, once what the reason says is fixed (JSON: <a href="/api/deadletters">/api/deadletters</a>).</p>
` + opsBar + `
<table id="deadletters"><tr><th>#</th><th>parked</th><th>consumer</th><th>from</th><th>trip</th><th>type</th><th>reason</th><th>re-driven by</th><th></th></tr>
{{range .Items}}<tr><td>{{.Seq}}</td><td>{{.Time.Format "2006-01-02 15:04:05"}}</td><td>{{.Consumer}}</td><td>{{.Stream}} #{{.StreamSeq}}<br><code>{{.Subject}}</code></td>
<td>{{if .TripID}}<a href="/trips/{{.TripID}}">{{.TripID}}</a>{{end}}</td><td><code>{{.Type}}</code></td><td>{{.Reason}}</td><td>{{range .RedrivenBy}}<code>{{.}}</code><br>{{end}}</td>
<td><button class="action redrive" data-needs-reason="1" data-key="{{.Key}}" data-body='{{json (dict "action" "redrive" "deadletter_seq" .Seq)}}' onclick="act(this)">re-drive</button>
<details><summary>headers</summary><pre>{{.Headers}}</pre></details></td></tr>
{{else}}<tr><td colspan="9">None.</td></tr>{{end}}</table>
` + consoleScript + `</body></html>{{end}}

{{define "console"}}<div id="console">` + navBar + `
{{with .Figures}}<h2>Figures</h2>
{{with .Rebuild}}<p id="rebuild" class="warn"><b>The view is {{if .Running}}being rebuilt{{else}}half rebuilt{{end}}</b> (since {{.Since.Format "2006-01-02 15:04:05"}} UTC): {{if .Running}}a replay is under way{{else}}its replay stopped half-way; run <code>tripsaga replay reconciler</code> again{{end}}. The figures and findings below are incomplete until it finishes, and the sweep raises none meanwhile.</p>{{end}}
<table id="figures">
<tr><th>unfinished trips</th><td id="fig-unfinished">{{.Unfinished}}</td><td>{{if .OldestUnfinished}}oldest <a href="/trips/{{.OldestUnfinished}}">{{.OldestUnfinished}}</a>, {{.OldestUnfinishedAge}} old{{else}}none{{end}}</td></tr>
<tr><th>request to final answer, last hour</th><td>{{.Answers.N}} trips <span title="the trips whose settling event this reconciler process applied; with several replicas each applies its share, so the counts of the replicas add up to all">(this replica's share)</span></td><td>p50 {{ms .Answers.P50}} · p95 {{ms .Answers.P95}} · p99 {{ms .Answers.P99}}</td></tr>
<tr><th>half trips per day (sweep)</th><td colspan="2">{{range .HalfPerDay}}{{.Day}}: <b>{{.Count}}</b> &nbsp; {{end}}</td></tr>
<tr><th>undo attempts (since the services started)</th><td colspan="2">{{range $k, $v := .UndoAttempts}}{{$k}} {{$v}} &nbsp; {{else}}none{{end}}</td></tr>
<tr><th>incidents open</th><td id="fig-incidents"><a href="/incidents">{{.IncidentsOpen}}</a></td><td>every service's tripsaga_incidents_open</td></tr>
<tr><th>dead letters waiting</th><td id="fig-deadletters"><a href="/deadletters">{{.DeadLetters}}</a></td><td>every consumer's tripsaga_deadletter_messages</td></tr>
</table>
{{if .Unread}}<p>Not read: {{range .Unread}}{{.}}; {{end}}</p>{{end}}
<h3>Consumers' lag</h3>
<table id="lag"><tr><th>service</th><th>consumer</th><th>stream</th><th>pending</th><th>delivered, not acked</th><th>oldest not acked</th></tr>
{{range .Consumers}}<tr><td>{{.Service}}</td><td>{{.Consumer}}</td><td>{{.Stream}}</td><td>{{.Pending}}</td><td>{{.AckPending}}</td><td>{{printf "%.1f" .OldestAge}} s</td></tr>{{end}}</table>
{{end}}
<h3>The last hour</h3>
{{.Chart}}
</div>{{end}}
`))

// renderConsole renders the dashboard's console part (search, figures,
// chart).
func (r *Reconciler) renderConsole(req *http.Request) template.HTML {
	var b strings.Builder
	if err := r.pages.ExecuteTemplate(&b, "console", r.console(req)); err != nil {
		r.log.Warn("reconciler: console render", "err", err)
	}
	return template.HTML(b.String()) //nolint:gosec // rendered by html/template
}
