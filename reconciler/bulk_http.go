package reconciler

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/tripsaga/tripsaga/process"
)

// registerBulk mounts the bulk actions:
//
//	POST /api/bulk-actions              [BulkRequest]: with dry_run, 200 [BulkDryRun] (no token needed,
//	                                    nothing recorded); else 201 [BulkAction] (token and
//	                                    Idempotency-Key required; the same key again: 200, Idempotent-Replayed)
//	GET  /api/bulk-actions              JSON {"items":[BulkAction...]}, newest first (limit, 1 to 1000, default 50)
//	GET  /api/bulk-actions/{id}         JSON [BulkAction] with its trips (the first 1000)
//	POST /api/bulk-actions/{id}/cancel  {"operator","reason"}: the trips not sent yet are skipped (token required)
//	GET  /bulk/{id}                     HTML: its progress, refreshing itself until it ends, with a cancel button
//	GET  /bulk                          HTML: the newest bulk actions
func (o *Operator) registerBulk(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/bulk-actions", o.serveBulkStart)
	mux.HandleFunc("GET /api/bulk-actions", o.serveBulks)
	mux.HandleFunc("GET /api/bulk-actions/{id}", o.serveBulk)
	mux.HandleFunc("POST /api/bulk-actions/{id}/cancel", o.serveBulkCancel)
	mux.HandleFunc("GET /bulk/{id}", o.serveBulkPage)
	mux.HandleFunc("GET /bulk", o.serveBulksPage)
}

// bulkItems is how many trips a bulk action's JSON and page list.
const bulkItems = 1000

func (o *Operator) serveBulkStart(w http.ResponseWriter, req *http.Request) {
	var br BulkRequest
	if !decodeBody(w, req, &br) {
		return
	}
	if br.DryRun {
		d, err := o.DryRunBulk(req.Context(), br)
		if err != nil {
			o.writeActionError(w, req, "bulk dry run", err)
			return
		}
		writeJSON(w, http.StatusOK, d)
		return
	}
	if !o.gate(w, req) {
		return
	}
	key, ok := idempotencyKey(w, req)
	if !ok {
		return
	}
	b, replayed, err := o.StartBulk(req.Context(), key, br)
	if err != nil {
		o.writeActionError(w, req, "bulk action", err)
		return
	}
	w.Header().Set("Location", "/bulk/"+b.ID)
	code := http.StatusCreated
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		code = http.StatusOK
	}
	writeJSON(w, code, b)
}

func (o *Operator) serveBulks(w http.ResponseWriter, req *http.Request) {
	limit := 50
	if s := req.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			invalid(w, req, "limit", "a number from 1 to 1000")
			return
		}
		limit = n
	}
	bs, err := o.Bulks(req.Context(), limit)
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: bulk actions", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": bs})
}

func (o *Operator) serveBulk(w http.ResponseWriter, req *http.Request) {
	b, err := o.Bulk(req.Context(), req.PathValue("id"), bulkItems)
	if err != nil {
		o.writeActionError(w, req, "bulk action", err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (o *Operator) serveBulkCancel(w http.ResponseWriter, req *http.Request) {
	if !o.gate(w, req) {
		return
	}
	var body struct {
		Operator string `json:"operator"`
		Reason   string `json:"reason"`
	}
	if !decodeBody(w, req, &body) {
		return
	}
	b, err := o.CancelBulk(req.Context(), req.PathValue("id"), body.Operator, body.Reason)
	if err != nil {
		o.writeActionError(w, req, "bulk cancel", err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (o *Operator) serveBulkPage(w http.ResponseWriter, req *http.Request) {
	b, err := o.Bulk(req.Context(), req.PathValue("id"), bulkItems)
	var ae *ActionError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		// A page, for a person who followed a stale link.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		if err := o.r.pages.ExecuteTemplate(w, "nobulk", ae.Detail); err != nil {
			o.log.Warn("reconciler: bulk page render", "err", err)
		}
		return
	}
	if err != nil {
		o.writeActionError(w, req, "bulk action", err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := o.r.pages.ExecuteTemplate(w, "bulk", b); err != nil {
		o.log.Warn("reconciler: bulk page render", "err", err)
	}
}

func (o *Operator) serveBulksPage(w http.ResponseWriter, req *http.Request) {
	bs, err := o.Bulks(req.Context(), 100)
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: bulk actions", err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := o.r.pages.ExecuteTemplate(w, "bulks", bs); err != nil {
		o.log.Warn("reconciler: bulk actions page render", "err", err)
	}
}

// bulkForm is the trip list's bulk action form: its dry run shows the
// count and a sample, and its run sends that count as expected_count.
const bulkForm = `<div class="ops" id="bulk" data-filter='{{json .Filter}}' data-key="{{key}}">
<b>Act on every trip this filter matches</b>:
action <select id="b-action">{{range bulkActions}}<option>{{.}}</option>{{end}}</select>
carried out by <select id="b-service"><option value="">each trip's open step's company</option>{{range actors}}<option>{{.}}</option>{{end}}</select>
at most <input id="b-rate" size="4" value="5"> actions/s per company (0: no limit) ·
canary <input id="b-canary" size="3" value="0"> first trips, then stop if any failed ·
incident (resolve) <input id="b-incident" size="14" placeholder="all open"> ·
outcome (settle) <select id="b-outcome"><option value=""></option><option>undone</option><option>done</option><option>not_done</option></select> ·
step (settle; redrive: from which) <input id="b-step" size="8"><br>
operator <input id="operator" size="12" value="operator">
token <input id="token" type="password" size="18" autocomplete="off" placeholder="OPERATOR_TOKEN">
reason <input id="reason" size="40" placeholder="why (kept with every trip's action)">
<button id="b-dry" type="button" onclick="bulkDry()">dry run</button>
<button id="b-run" type="button" disabled onclick="bulkRun(this)">run</button>
<div id="bulk-result"></div></div>`

// bulkScript drives [bulkForm].
const bulkScript = `<script>
function bulkBody(dry){
  var el=function(id){return document.getElementById(id)};
  var b={action:el('b-action').value,filter:JSON.parse(el('bulk').dataset.filter),dry_run:dry,
    rate_per_s:parseFloat(el('b-rate').value)||0,canary:parseInt(el('b-canary').value,10)||0,
    reason:el('reason').value.trim(),operator:el('operator').value.trim()||'operator'};
  if(el('b-service').value){b.service=el('b-service').value}
  if(el('b-incident').value.trim()){b.incident=el('b-incident').value.trim()}
  if(el('b-outcome').value){b.outcome=el('b-outcome').value}
  if(el('b-step').value.trim()){b.step=el('b-step').value.trim()}
  return b;
}
function bulkDry(){
  var out=document.getElementById('bulk-result'), run=document.getElementById('b-run');
  run.disabled=true; out.textContent='counting…';
  fetch('/api/bulk-actions',{method:'POST',headers:{'Content-Type':'application/json'},body:JSON.stringify(bulkBody(true))})
    .then(function(r){return r.json().then(function(d){
      if(!r.ok){out.textContent=r.status+' '+(d.detail||d.title);out.dataset.status=r.status;return}
      var by=Object.keys(d.by_service).map(function(k){return (k||'nobody: skipped')+' '+d.by_service[k]}).join(', ');
      out.innerHTML='';
      var p=document.createElement('div'); p.id='dry-count'; p.dataset.count=d.count;
      p.textContent=d.count+' trips would get '+d.action+(by?' ('+by+')':'')+'. Sample: '+d.sample.map(function(t){return t.trip_id+' at '+(t.service||'-')}).join(', ');
      out.appendChild(p); out.dataset.status=r.status;
      run.dataset.count=d.count; run.textContent='run on these '+d.count+' trips'; run.disabled=d.count===0;
    })})
    .catch(function(e){out.textContent='failed: '+e});
}
function bulkRun(btn){
  var out=document.getElementById('bulk-result');
  var token=document.getElementById('token').value.trim();
  if(!token){out.textContent='An operator token (OPERATOR_TOKEN) is needed to act.';return;}
  sessionStorage.setItem('tripsaga-token',token);
  var b=bulkBody(false); b.expected_count=parseInt(btn.dataset.count,10);
  if(!b.reason){out.textContent='Give a reason first: it is kept with every action.';return;}
  btn.disabled=true; delete out.dataset.status; out.textContent='sending…';
  fetch('/api/bulk-actions',{method:'POST',headers:{'Authorization':'Bearer '+token,'Idempotency-Key':document.getElementById('bulk').dataset.key,'Content-Type':'application/json'},body:JSON.stringify(b)})
    .then(function(r){return r.json().then(function(d){
      if(r.ok){location.href='/bulk/'+d.id;return}
      out.textContent=r.status+' '+(d.detail||d.title); out.dataset.status=r.status;
    })})
    .catch(function(e){out.textContent='failed: '+e; btn.disabled=false});
}
</script>`

// bulkPages are the bulk actions' templates, parsed into the console's
// (consolePagesOf).
const bulkPages = `
{{define "bulk"}}{{template "head" (printf "bulk action %s" .ID)}}
<h1>Bulk action <code id="bulk-id">{{.ID}}</code>: {{.Action}} <span id="bulk-state" class="{{.State}}" data-ended="{{.Ended}}">{{.State}}</span></h1>
{{with .StateReason}}<p id="bulk-state-reason">{{.}}</p>{{end}}
<p><progress id="bulk-progress" max="{{.Trips}}" value="{{add (index .Counts "done") (index .Counts "failed") (index .Counts "skipped")}}"></progress>
{{add (index .Counts "done") (index .Counts "failed") (index .Counts "skipped")}} of {{.Trips}} trips finished{{if not .Ended}} · <span id="updated-bulk">refreshing every 2 s</span>{{end}}</p>
<table id="bulk-counts"><tr>{{range bulkTripStates}}<th>{{.}}</th>{{end}}</tr><tr>{{range bulkTripStates}}<td data-state="{{.}}">{{index $.Counts .}}</td>{{end}}</tr></table>
<table id="bulk-audit">
<tr><th>filter</th><td><a href="/trips?{{.Filter.Query.Encode}}"><code>{{.Filter}}</code></a></td></tr>
<tr><th>carried out by</th><td>{{or .Service "each trip's open step's company"}}</td></tr>
<tr><th>rate limit</th><td>{{if .RatePerS}}{{.RatePerS}} actions/s per company{{else}}none{{end}}</td></tr>
<tr><th>canary</th><td>{{if .Canary}}the first {{.Canary}} trips, then stop if any failed{{else}}none{{end}}</td></tr>
<tr><th>asked by</th><td id="bulk-operator">{{.Operator}}: {{.Reason}}</td></tr>
<tr><th>recorded</th><td>{{.CreatedAt.Format "2006-01-02 15:04:05"}} UTC{{with .FinishedAt}} · ended {{.Format "15:04:05"}}{{end}}</td></tr>
</table>
{{if not .FinishedAt}}<div class="ops">operator <input id="operator" size="12" value="operator">
token <input id="token" type="password" size="18" autocomplete="off" placeholder="OPERATOR_TOKEN">
reason <input id="reason" size="40" placeholder="why">
<button id="cancel" type="button" onclick="bulkCancel()">cancel</button><div id="action-result"></div></div>{{end}}
<table id="bulk-trips"><tr><th>#</th><th>trip</th><th>service</th><th>state</th><th>what it did</th><th>sent</th><th>finished</th></tr>
{{range $i, $t := .Items}}<tr class="bulk-trip {{.State}}" data-trip="{{.TripID}}" data-state="{{.State}}"><td>{{$i}}</td><td><a href="/trips/{{.TripID}}">{{.TripID}}</a></td><td>{{.Service}}</td><td>{{.State}}</td><td>{{visible .Effect}}</td>
<td>{{with .SentAt}}{{.Format "15:04:05.000"}}{{end}}</td><td>{{with .FinishedAt}}{{.Format "15:04:05.000"}}{{end}}</td></tr>{{end}}</table>
<script>
(function(){
  var t=document.getElementById('token'), o=document.getElementById('operator');
  if(t){t.value=sessionStorage.getItem('tripsaga-token')||''}
  if(o){o.value=sessionStorage.getItem('tripsaga-operator')||o.value}
  if(document.getElementById('bulk-state').dataset.ended!=='true'){
    setTimeout(function tick(){
      var a=document.activeElement, r=document.getElementById('reason');
      if((a&&a.tagName==='INPUT')||(r&&r.value)){setTimeout(tick,2000);return}
      location.reload();
    },2000);
  }
})();
function bulkCancel(){
  var out=document.getElementById('action-result');
  var token=document.getElementById('token').value.trim(), reason=document.getElementById('reason').value.trim();
  if(!token||!reason){out.textContent='The operator token and a reason are needed to cancel.';return}
  fetch('/api/bulk-actions/{{.ID}}/cancel',{method:'POST',headers:{'Authorization':'Bearer '+token,'Content-Type':'application/json'},
    body:JSON.stringify({operator:document.getElementById('operator').value.trim()||'operator',reason:reason})})
    .then(function(r){return r.text().then(function(x){out.textContent=r.status+' '+x; if(r.ok){location.reload()}})});
}
</script></body></html>{{end}}

{{define "nobulk"}}{{template "head" "no such bulk action"}}
<h1>No such bulk action</h1><p id="no-bulk">{{.}}. The <a href="/bulk">bulk actions</a> page lists them all.</p></body></html>{{end}}

{{define "bulks"}}{{template "head" "bulk actions"}}
<h1>Bulk actions</h1>
<table id="bulks"><tr><th>id</th><th>action</th><th>state</th><th>trips</th><th>done</th><th>failed</th><th>waiting</th><th>asked by</th><th>recorded</th></tr>
{{range .}}<tr><td><a href="/bulk/{{.ID}}">{{.ID}}</a></td><td>{{.Action}}</td><td class="{{.State}}">{{.State}}</td><td>{{.Trips}}</td><td>{{index .Counts "done"}}</td><td>{{index .Counts "failed"}}</td><td>{{index .Counts "waiting"}}</td><td>{{.Operator}}: {{.Reason}}</td><td>{{.CreatedAt.Format "2006-01-02 15:04:05"}}</td></tr>
{{else}}<tr><td colspan="9">None yet: filter the <a href="/trips">trips</a> and act on them.</td></tr>{{end}}</table>
</body></html>{{end}}
`
