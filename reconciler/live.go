package reconciler

// liveTemplate defines the template "live", which the dashboard and the
// trip page show near their top: when the server rendered the page
// (its dot, a time.Time in UTC) in <span id="updated">, a checkbox that
// pauses the refresh (remembered for the browser tab), why a refresh was
// skipped, and the script that refreshes the page.
//
// Every 5 s the script fetches the page's own URL again and
// puts the new body in place of the old one (no reload: the scroll
// position stays; the operator token and name typed on the page are kept,
// and so is an action's answer). It skips a refresh while the tab is
// hidden, while a text field has the focus or holds text that would be
// lost (the reason, a search), while an action's request is under way
// (its button disabled), or while paused; an answer that is not the page
// (a 503 while PostgreSQL is down) leaves the page as it was and says so.
// The script of the new body is not run: the one of the first load goes
// on. Nothing is guaranteed about a refresh's timing; the page says when
// what it shows was rendered.
const liveTemplate = `{{define "live"}}<p class="live" style="font-size:.8rem;color:#555"><span id="updated">updated {{.UTC.Format "15:04:05"}} UTC</span>
· <label><input type="checkbox" id="live-pause"> pause live refresh</label> <span id="live-state"></span></p>
<script>
(function(){
  if(window.tripsagaLive)return; window.tripsagaLive=true;
  var key='tripsaga-live-paused', inflight=false;
  function paused(){return sessionStorage.getItem(key)==='1'}
  function state(s){var e=document.getElementById('live-state'); if(e)e.textContent=s}
  function bind(){var b=document.getElementById('live-pause'); if(b)b.checked=paused(); state(paused()?'(paused)':'')}
  // The body is replaced on refresh: listen on the document, which stays.
  document.addEventListener('change',function(ev){
    var t=ev.target;
    if(t.id==='live-pause'){sessionStorage.setItem(key,t.checked?'1':''); state(t.checked?'(paused)':'')}
    if(t.id==='token')sessionStorage.setItem('tripsaga-token',t.value);
    if(t.id==='operator')sessionStorage.setItem('tripsaga-operator',t.value);
  });
  // Kept across a refresh, not a reason to wait: the token and the
  // operator's name (also in sessionStorage).
  var kept=['token','operator'];
  function busy(){
    var a=document.activeElement;
    if(a&&a.matches&&a.matches('textarea,select,input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit])'))return 'typing';
    var fs=document.querySelectorAll('input,textarea');
    for(var i=0;i<fs.length;i++){
      var f=fs[i];
      if(f.type==='checkbox'||f.type==='radio'||kept.indexOf(f.id)>=0)continue;
      if(f.value!==f.defaultValue)return 'a field holds text';
    }
    if(document.querySelector('button:disabled'))return 'an action is under way';
    return '';
  }
  function tick(){
    if(inflight||document.hidden||paused())return;
    var why=busy(); if(why){state('(waits: '+why+')');return}
    inflight=true;
    fetch(location.href,{headers:{'Accept':'text/html'},cache:'no-store',credentials:'same-origin'})
      .then(function(r){return r.text().then(function(html){return {r:r,html:html}})})
      .then(function(x){
        inflight=false;
        if(paused()||busy())return;
        var doc=new DOMParser().parseFromString(x.html,'text/html');
        if(!doc.getElementById('updated')){state('(not refreshed: '+x.r.status+')');return}
        var vals={};
        kept.forEach(function(id){var e=document.getElementById(id); if(e)vals[id]=e.value});
        var res=document.getElementById('action-result'), y=window.scrollY;
        document.body.replaceWith(doc.body);
        kept.forEach(function(id){var e=document.getElementById(id); if(e&&vals[id]!==undefined)e.value=vals[id]});
        var n=document.getElementById('action-result');
        if(res&&n&&res.textContent){n.textContent=res.textContent; if(res.dataset.status)n.dataset.status=res.dataset.status}
        window.scrollTo(0,y);
        bind();
      })
      .catch(function(e){inflight=false; state('(not refreshed: '+e+')')});
  }
  bind();
  setInterval(tick,5000);
})();
</script>{{end}}`
