/*
 * tripsaga's step protocol as a Promela model (issue 21).
 *
 * One or two trips (NT) through the default order hotel, payment, car
 * (the pivot), then the trips service's final mail. Every step service
 * runs REPLICAS replicas; the trips service one. The database (step log,
 * inbox tables, outbox), JetStream and the companies are shared globals;
 * every database transaction is one atomic step. docs/model.md says what
 * is modelled, what is abstracted and why, and maps each part to the Go
 * code.
 *
 * Switches (spin -D...):
 *   NT=1|2          trips (2: racing for the hotel's last room)
 *   FAULTS=n        budget of injected faults (lost answers, 5xx, late
 *                   commits, slow owners, refused undos)
 *   CRASHES=n       budget of process crashes (SIGKILL + restart)
 *   REPLICAS=1|2    replicas of each step service
 *   NOREJECT        companies never reject (smaller two-trip runs)
 * Seeded bugs, one at a time (each must give a counter-example):
 *   BUG_CALL_BEFORE_LOG  the company is called before the step is written
 *                        down; the row is written only with the answer
 *   BUG_TIMEOUT_FAILS    an unknown answer (timeout, 5xx) is taken as failed
 *   BUG_INBOX_APART      the inbox row commits in its own transaction, apart
 *                        from the effect
 *   BUG_LEASE_LIVE       a replica takes a lease whose owner's call is still
 *                        in flight
 */

#ifndef NT
#define NT 1
#endif
#ifndef FAULTS
#define FAULTS 2
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef REPLICAS
#define REPLICAS 2
#endif
/* replicas of each step service (REPLICAS unless set one by one) */
#ifndef RH
#define RH REPLICAS
#endif
#ifndef RP
#define RP REPLICAS
#endif
#ifndef RC
#define RC REPLICAS
#endif

/* steps (= services: the trips service runs the mail step) */
#define HOTEL 0
#define PAY   1
#define CAR   2
#define MAIL  3
#define NS    4
#define IX(sc_t, sc_s) ((sc_t) * NS + (sc_s))

/* step log status (saga/step.go) */
#define NONE         0
#define STARTED      2
#define UNKNOWN      3
#define DONE         4
#define REJECTED     5
#define COMPENSATING 6
#define COMPENSATED  7
#define FAILED       8
#define VOIDED       9

/* undo cause */
#define C_COMP     0
#define C_DEADLINE 1

/* incidents */
#define INC_NONE    0
#define INC_STUCK   1   /* compensation_stuck: IncidentAfter failed undos */
#define INC_REFUSED 2   /* compensation_refused: refused for good */
#define INCIDENT_AFTER 2

/* company record per key */
#define CN 0   /* nothing under the key */
#define CA 1   /* in force (held, charged, booked, sent) */
#define CU 2   /* undone (released, refunded, canceled) */
#define CR 3   /* rejected (sold out, declined) */

/* answers */
#define R_DONE    1
#define R_REJ     2
#define R_UNK     3
#define R_UNDONE  4
#define R_NONE    5
#define R_REFUSED 6

/* events: bit numbers in a trip'sc_s masks */
#define E_TREQ 0
#define EV_DONE(sc_s)   (1 + 5 * (sc_s))
#define EV_REJ(sc_s)    (2 + 5 * (sc_s))
#define EV_FAIL(sc_s)   (3 + 5 * (sc_s))
#define EV_UNDONE(sc_s) (4 + 5 * (sc_s))
#define EV_STUCK(sc_s)  (5 + 5 * (sc_s))
#define E_TCONF 16
#define E_TCANC 17
#define B(sc_e) (1 << (sc_e))
#define HAS(sc_m, sc_e) (((sc_m) & B(sc_e)) != 0)
/* what each service'sc_s inboxes consume (events/catalogue.go) */
#define MASK_HOTEL (B(E_TREQ) | B(EV_REJ(PAY)) | B(EV_FAIL(PAY)) | B(EV_UNDONE(PAY)) | B(EV_STUCK(PAY)))
#define MASK_PAY   (B(EV_DONE(HOTEL)) | B(EV_REJ(CAR)) | B(EV_FAIL(CAR)) | B(EV_STUCK(CAR)))
#define MASK_CAR   (B(EV_DONE(PAY)))
#define MASK_TRIPS 65534  /* every step event, bits 1..15 (0xFFFE) */
#define CONSUMES(svc) ((svc) == HOTEL -> MASK_HOTEL : ((svc) == PAY -> MASK_PAY : ((svc) == CAR -> MASK_CAR : MASK_TRIPS)))

/* trip status (services/trips) */
#define T_PENDING   0
#define T_CONFIRMED 1
#define T_CANCELING 2
#define T_CANCELED  3

/* replica jobs */
#define J_NONE 0
#define J_FWD  1
#define J_UNDO 2
#define J_FWD_NOLOG 3   /* BUG_CALL_BEFORE_LOG only */
#define P_IDLE     0
#define P_CLAIMED  1
#define P_CALLING  2
#define P_ANSWERED 3

/* ---- the database: step log (one row per trip and step) ---- */
byte st[NT * NS];
bit  leased[NT * NS];     /* a lease in force (next_attempt_at in the future, owner set) */
byte owner[NT * NS];      /* replica id of the lease */
byte att[NT * NS];        /* attempts */
byte uatt[NT * NS];       /* undo_attempts */
bit  cause[NT * NS];
bit  dl[NT * NS];         /* the step'sc_s deadline has passed */
bit  vrf[NT * NS];        /* verify_at set: ask again sc_later (late commit) */
byte inc[NT * NS];        /* open incident of the step */
/* inbox tables, per trip and consuming service: event bits handled */
int  inbox[NT * NS];
/* the outbox: event bits written (published or not) */
int  outbox[NT];
/* the trips projection */
int  seen[NT];
byte tstat[NT];
byte topen[NT];           /* step bits of open undos */
byte mailkind[NT];        /* the status the mail row was recorded for */

/* ---- JetStream: a stream is a set of event ids (the duplicate window
 * drops a re-published id); a consumer'sc_s acks per service ---- */
int  stream[NT];
int  acked[NT * NS];

/* ---- companies, per Idempotency-Key <trip>:<step> ---- */
byte comp[NT * NS];
bit  late[NT * NS];       /* a request that timed out may still commit */
bit  refuses[NT * NS];    /* the company refuses this key'sc_s undo for good */
byte inflight[NT * NS];   /* calls of the key in flight */
byte undos[NT * NS];      /* records undone (in force -> undone) */
byte mails[NT];           /* final mails the mail relay accepted */
byte rooms = 1;           /* the hotel'sc_s last room */

/* ---- replicas (id 1..): their sc_job, visible to the lease rule ---- */
#define NR (RH + RP + RC + 2)
byte rjob[NR];
byte rjt[NR];             /* the sc_job'sc_s trip */

/* scratch of one atomic step, never carried from one step to the next:
 * hidden, out of the state vector */
hidden byte sc_t, sc_e, sc_i, sc_s, sc_nst, sc_nopen, sc_job;
hidden byte sc_later, sc_undoing;
hidden int sc_m;

byte faults = FAULTS;
byte crashes = CRASHES;

/* ------------------------------------------------------------------ */

/* the trips projection: services/trips/chain.go project(), for the
 * chain hotel, payment, car */
inline project(sc_t) {
  sc_m = seen[sc_t];
  if
  :: HAS(sc_m, EV_DONE(CAR)) -> sc_nst = T_CONFIRMED; sc_nopen = 0
  :: else ->
     if
     :: (sc_m & (B(EV_REJ(HOTEL)) | B(EV_FAIL(HOTEL)) | B(EV_STUCK(HOTEL)) |
              B(EV_REJ(PAY)) | B(EV_FAIL(PAY)) | B(EV_STUCK(PAY)) |
              B(EV_REJ(CAR)) | B(EV_FAIL(CAR)) | B(EV_STUCK(CAR)))) == 0 ->
        sc_nst = T_PENDING; sc_nopen = 0
     :: else ->
        sc_later = 0; sc_undoing = 0; sc_nopen = 0; sc_s = CAR;
        do
        :: true ->
           if
           :: (HAS(sc_m, EV_DONE(sc_s)) || HAS(sc_m, EV_STUCK(sc_s)) || sc_later) &&
              !(HAS(sc_m, EV_REJ(sc_s)) || HAS(sc_m, EV_FAIL(sc_s)) || HAS(sc_m, EV_UNDONE(sc_s))) ->
              if
              :: HAS(sc_m, EV_STUCK(sc_s)) -> sc_nopen = sc_nopen | (1 << sc_s)
              :: else -> sc_undoing = 1
              fi
           :: else -> skip
           fi;
           sc_later = sc_later || ((sc_m & (B(EV_DONE(sc_s)) | B(EV_REJ(sc_s)) | B(EV_FAIL(sc_s)) | B(EV_UNDONE(sc_s)) | B(EV_STUCK(sc_s)))) != 0);
           if
           :: sc_s == HOTEL -> break
           :: else -> sc_s--
           fi
        od;
        sc_nst = ((sc_undoing || sc_nopen != 0) -> T_CANCELING : T_CANCELED)
     fi
  fi
}

/* saga.Runner.Request inside the trigger'sc_s inbox transaction: the row is
 * written started with this replica'sc_s lease; the call is launched after
 * the commit (when a slot is free: one sc_job per replica here) */
inline request(sc_t, sc_s) {
#ifdef BUG_CALL_BEFORE_LOG
  if
  :: sc_s != MAIL && st[IX(sc_t, sc_s)] == NONE && rjob[me] == J_NONE ->
     rjob[me] = J_FWD_NOLOG; rjt[me] = sc_t; phase = P_CLAIMED
  :: else ->
#endif
  if
  :: st[IX(sc_t, sc_s)] == NONE ->
     st[IX(sc_t, sc_s)] = STARTED; att[IX(sc_t, sc_s)] = 1;
     leased[IX(sc_t, sc_s)] = 1; owner[IX(sc_t, sc_s)] = me;
     if
     :: rjob[me] == J_NONE -> rjob[me] = J_FWD; rjt[me] = sc_t; jg = 1; phase = P_CLAIMED
     :: else -> skip   /* waits for a slot; its lease runs out meanwhile */
     fi
  :: else -> skip     /* recorded already, or voided */
  fi
#ifdef BUG_CALL_BEFORE_LOG
  fi
#endif
}

/* saga.Runner.RequestUndoOf / undoRow */
inline request_undo(sc_t, sc_s) {
  sc_i = IX(sc_t, sc_s);
  if
  :: st[sc_i] == NONE ->
     st[sc_i] = VOIDED; outbox[sc_t] = outbox[sc_t] | B(EV_UNDONE(sc_s))
  :: st[sc_i] == DONE || st[sc_i] == UNKNOWN ->
     st[sc_i] = COMPENSATING; cause[sc_i] = C_COMP; leased[sc_i] = 0
  :: st[sc_i] == STARTED ->
     st[sc_i] = COMPENSATING; cause[sc_i] = C_COMP   /* a call in flight keeps its lease */
  :: else -> skip
  fi
}

/* an event'sc_s effect in its consumer'sc_s inbox transaction */
inline effect(sc_t, sc_e) {
  if
  :: svc == HOTEL && sc_e == E_TREQ -> request(sc_t, HOTEL)
  :: svc == HOTEL && sc_e != E_TREQ -> request_undo(sc_t, HOTEL)
  :: svc == PAY && sc_e == EV_DONE(HOTEL) -> request(sc_t, PAY)
  :: svc == PAY && sc_e != EV_DONE(HOTEL) -> request_undo(sc_t, PAY)
  :: svc == CAR -> request(sc_t, CAR)
  :: svc == MAIL ->
     /* services/trips project(): the set of kinds seen gives the status;
      * a final status publishes trip.confirmed/canceled and records the
      * mail step in the same transaction */
     seen[sc_t] = seen[sc_t] | B(sc_e);
     if
     :: tstat[sc_t] == T_CONFIRMED || tstat[sc_t] == T_CANCELED -> skip
     :: else ->
        project(sc_t);
        topen[sc_t] = sc_nopen;
        if
        :: sc_nst != tstat[sc_t] ->
           tstat[sc_t] = sc_nst;
           if
           :: sc_nst == T_CONFIRMED ->
              outbox[sc_t] = outbox[sc_t] | B(E_TCONF); mailkind[sc_t] = T_CONFIRMED; request(sc_t, MAIL)
           :: sc_nst == T_CANCELED ->
              outbox[sc_t] = outbox[sc_t] | B(E_TCANC); mailkind[sc_t] = T_CANCELED; request(sc_t, MAIL)
           :: else -> skip
           fi
        :: else -> skip
        fi
     fi
  fi
}

/* SIGKILL and restart: what is in memory is lost (a call in flight is
 * abandoned: the company may still carry it out); the database, the
 * streams and the companies keep theirs */
inline crash() {
  crashes--;
  if
  :: phase == P_CALLING ->
     sc_t = rjt[me]; sc_i = IX(sc_t, svc); sc_job = rjob[me];
     company_abandoned(sc_i, svc); inflight[sc_i]--
  :: else -> skip
  fi;
#ifdef BUG_INBOX_APART
  pend = 255;
#endif
  rjob[me] = J_NONE; phase = P_IDLE; res = 0; jg = 0
}

/* outbox.Inbox.process: the inbox row and the effect in one transaction,
 * acked after the commit (a crash before the ack redelivers it) */
#ifndef BUG_INBOX_APART
#define DELIVER(T, E) \
  :: atomic { HAS(CONSUMES(svc), E) && HAS(stream[T], E) && !HAS(acked[IX(T, svc)], E) \
       BUGGUARD(T, E) -> \
       if \
       :: !HAS(inbox[IX(T, svc)], E) -> inbox[IX(T, svc)] = inbox[IX(T, svc)] | B(E); effect(T, E) \
       :: else -> skip /* a duplicate: acked */ \
       fi; \
       if \
       :: acked[IX(T, svc)] = acked[IX(T, svc)] | B(E) \
       :: crashes > 0 -> crash() /* killed after commit, before the ack */ \
       fi }
#else
/* the bug: the inbox row commits first, the effect in a transaction of
 * its own; a crash between them loses the effect for good */
#define DELIVER(T, E) \
  :: atomic { HAS(CONSUMES(svc), E) && HAS(stream[T], E) && !HAS(acked[IX(T, svc)], E) && pend == 255 -> \
       if \
       :: !HAS(inbox[IX(T, svc)], E) -> inbox[IX(T, svc)] = inbox[IX(T, svc)] | B(E); pend = E; pt = T \
       :: else -> acked[IX(T, svc)] = acked[IX(T, svc)] | B(E) \
       fi }
#endif
#ifdef BUG_CALL_BEFORE_LOG
#define BUGGUARD(T, E) && (rjob[me] == J_NONE || st[IX(T, svc)] != NONE || !((svc == HOTEL && E == E_TREQ) || (svc == PAY && E == EV_DONE(HOTEL)) || (svc == CAR && E == EV_DONE(PAY))))
#else
#define BUGGUARD(T, E)
#endif

/* saga.Runner.claim: a due row (not leased, not parked by a refusal)
 * gets a lease; unknown past its deadline is undone by key */
#define DUE(T) ((st[IX(T, svc)] == STARTED || st[IX(T, svc)] == UNKNOWN || \
                 (st[IX(T, svc)] == COMPENSATING && inc[IX(T, svc)] != INC_REFUSED)) && \
                !leased[IX(T, svc)])
#define CLAIM(T) \
  :: atomic { rjob[me] == J_NONE && DUE(T) -> \
       sc_i = IX(T, svc); rjt[me] = T; phase = P_CLAIMED; \
       if \
       :: st[sc_i] == COMPENSATING -> uatt[sc_i]++; rjob[me] = J_UNDO; jg = uatt[sc_i] \
       :: st[sc_i] != COMPENSATING && svc != MAIL -> \
          /* time passes: the deadline may be past now, and stays past */ \
          if \
          :: dl[sc_i] = 1 \
          :: !dl[sc_i] \
          fi; \
          if \
          :: dl[sc_i] -> st[sc_i] = COMPENSATING; cause[sc_i] = C_DEADLINE; uatt[sc_i]++; rjob[me] = J_UNDO; jg = uatt[sc_i] \
          :: else -> st[sc_i] = STARTED; att[sc_i]++; rjob[me] = J_FWD; jg = att[sc_i] \
          fi \
       :: st[sc_i] != COMPENSATING && svc == MAIL -> st[sc_i] = STARTED; att[sc_i]++; rjob[me] = J_FWD; jg = att[sc_i] \
       fi; \
       leased[sc_i] = 1; owner[sc_i] = me }

/* saga.Runner.verify: an undone step whose undo found nothing is asked
 * again by key; found in force (a late commit), it is undone again.
 * Asking while the company can still commit late and finds nothing
 * changes nothing, so it is taken only when it decides something. */
#define VERIFY(T) \
  :: atomic { rjob[me] == J_NONE && vrf[IX(T, svc)] && !leased[IX(T, svc)] && \
       (comp[IX(T, svc)] == CA || !late[IX(T, svc)]) -> \
       sc_i = IX(T, svc); vrf[sc_i] = 0; \
       if \
       :: comp[sc_i] == CA -> st[sc_i] = COMPENSATING \
       :: else -> skip /* nothing, and nothing can commit late any more */ \
       fi }

/* the company'sc_s side of a create by key */
inline company_create(sc_i, sc_s) {
  if
  :: comp[sc_i] == CN ->
     if
     :: sc_s != HOTEL || rooms > 0 ->
        if
        :: sc_s == HOTEL -> rooms-- :: else -> skip
        fi;
        comp[sc_i] = CA;
        if
        :: sc_s == MAIL -> assert(mails[sc_i / NS] == 0); mails[sc_i / NS]++
        :: else -> skip
        fi;
        if
        :: res = R_DONE
        :: faults > 0 -> faults--; res = R_UNK   /* committed, the answer lost */
        fi
#ifndef NOREJECT
     :: sc_s != MAIL -> comp[sc_i] = CR; res = R_REJ   /* sold out, declined */
#endif
     :: sc_s == HOTEL && rooms == 0 -> comp[sc_i] = CR; res = R_REJ   /* sold out: the last room is gone */
     :: faults > 0 -> faults--; res = R_UNK                     /* 5xx, nothing done */
     :: faults > 0 && sc_s != MAIL -> faults--; late[sc_i] = 1; res = R_UNK  /* times out, may commit late */
     fi
  :: comp[sc_i] == CA ->
     if
     :: res = R_DONE   /* the same key again: the same record */
     :: faults > 0 -> faults--; res = R_UNK
     fi
  :: comp[sc_i] == CR ->
     if
     :: res = R_REJ
     :: faults > 0 -> faults--; res = R_UNK
     fi
  :: comp[sc_i] == CU -> res = R_UNK   /* undone: not in force */
  fi
}

/* a late request lands (or is dropped) */
inline company_late(sc_i, sc_s) {
  late[sc_i] = 0;
  if
  :: comp[sc_i] == CN && (sc_s != HOTEL || rooms > 0) ->
     if :: sc_s == HOTEL -> rooms-- :: else -> skip fi;
     comp[sc_i] = CA
  :: else -> skip
  fi
}

/* the company'sc_s side of an undo by key */
inline company_undo(sc_i, sc_s) {
  if
  :: refuses[sc_i] -> res = R_REFUSED
  :: else ->
     if
     :: comp[sc_i] == CA ->
        if
        :: true ->
           assert(undos[sc_i] == 0); undos[sc_i]++; comp[sc_i] = CU;
           if :: sc_s == HOTEL -> rooms++ :: else -> skip fi;
           if
           :: res = R_UNDONE
           :: faults > 0 -> faults--; res = R_UNK   /* undone, the answer lost */
           fi
        :: faults > 0 -> faults--; res = R_UNK       /* 5xx, not undone */
        :: faults > 0 -> faults--; refuses[sc_i] = 1; res = R_REFUSED  /* 422 card closed */
        fi
     :: comp[sc_i] == CU ->
        if
        :: res = R_UNDONE
        :: faults > 0 -> faults--; res = R_UNK
        fi
     :: comp[sc_i] == CN || comp[sc_i] == CR ->
        if
        :: res = R_NONE
        :: faults > 0 -> faults--; res = R_UNK
        fi
     fi
  fi
}

/* the company'sc_s side of a call its caller abandoned (killed) */
inline company_abandoned(sc_i, sc_s) {
  if
  :: skip                                   /* never arrived */
  :: sc_job == J_UNDO -> company_undo(sc_i, sc_s)    /* done, nobody hears */
  :: sc_job != J_UNDO -> company_create(sc_i, sc_s)
  fi
}

/* saga.Runner.forward'sc_s answer, recorded only if the row is still as
 * claimed (updateIf / inTx: status started, same attempts) */
inline record_forward(sc_i, sc_t, sc_s) {
  if
  :: st[sc_i] == STARTED && att[sc_i] == jg ->
     leased[sc_i] = 0;   /* endLease; an unknown one is due after its backoff */
     if
     :: res == R_DONE -> st[sc_i] = DONE; outbox[sc_t] = outbox[sc_t] | B(EV_DONE(sc_s))
     :: res == R_REJ -> st[sc_i] = REJECTED; outbox[sc_t] = outbox[sc_t] | B(EV_REJ(sc_s))
     :: res == R_UNK ->
#ifdef BUG_TIMEOUT_FAILS
        if
        :: sc_s != MAIL -> st[sc_i] = FAILED; outbox[sc_t] = outbox[sc_t] | B(EV_FAIL(sc_s))
        :: else -> st[sc_i] = UNKNOWN
        fi
#else
        st[sc_i] = UNKNOWN   /* unknown is not failed: asked again by the same key */
#endif
     fi
  :: else -> skip   /* undo asked for meanwhile, or another replica took it */
  fi
}

/* saga.Runner.undo'sc_s answer */
inline record_undo(sc_i, sc_t, sc_s) {
  if
  :: st[sc_i] == COMPENSATING && uatt[sc_i] == jg ->
     leased[sc_i] = 0;
     if
     :: res == R_REFUSED ->
        if
        :: inc[sc_i] != INC_REFUSED -> inc[sc_i] = INC_REFUSED; outbox[sc_t] = outbox[sc_t] | B(EV_STUCK(sc_s))
        :: else -> skip
        fi
     :: res == R_UNK ->
        if
        :: uatt[sc_i] >= INCIDENT_AFTER && inc[sc_i] == INC_NONE ->
           inc[sc_i] = INC_STUCK; outbox[sc_t] = outbox[sc_t] | B(EV_STUCK(sc_s))
        :: else -> skip
        fi
     :: res == R_UNDONE || res == R_NONE ->
        inc[sc_i] = INC_NONE;   /* IncidentResolve */
        if
        :: res == R_NONE && att[sc_i] > 0 -> vrf[sc_i] = 1
        :: else -> skip
        fi;
        if
        :: cause[sc_i] == C_DEADLINE -> st[sc_i] = FAILED; outbox[sc_t] = outbox[sc_t] | B(EV_FAIL(sc_s))
        :: else -> st[sc_i] = COMPENSATED; outbox[sc_t] = outbox[sc_t] | B(EV_UNDONE(sc_s))
        fi
     fi
  :: else -> skip
  fi
}

proctype Replica(byte svc; byte me) {
  byte res, jg, phase;
#ifdef BUG_INBOX_APART
  byte pend = 255, pt;
#endif
end:
  do
  DELIVER(0, 0) DELIVER(0, 1) DELIVER(0, 2) DELIVER(0, 3) DELIVER(0, 4) DELIVER(0, 5)
  DELIVER(0, 6) DELIVER(0, 7) DELIVER(0, 8) DELIVER(0, 9) DELIVER(0, 10) DELIVER(0, 11)
  DELIVER(0, 12) DELIVER(0, 13) DELIVER(0, 14) DELIVER(0, 15)
#if NT > 1
  DELIVER(1, 0) DELIVER(1, 1) DELIVER(1, 2) DELIVER(1, 3) DELIVER(1, 4) DELIVER(1, 5)
  DELIVER(1, 6) DELIVER(1, 7) DELIVER(1, 8) DELIVER(1, 9) DELIVER(1, 10) DELIVER(1, 11)
  DELIVER(1, 12) DELIVER(1, 13) DELIVER(1, 14) DELIVER(1, 15)
#endif
#ifdef BUG_INBOX_APART
  :: atomic { pend != 255 -> effect(pt, pend); acked[IX(pt, svc)] = acked[IX(pt, svc)] | B(pend); pend = 255 }
#endif
  CLAIM(0)
#if NT > 1
  CLAIM(1)
#endif
  VERIFY(0)
#if NT > 1
  VERIFY(1)
#endif
  /* leaseCovers + call: renew the lease if the row is still as claimed,
   * then send; a row that changed is not called */
  :: atomic { rjob[me] != J_NONE && phase == P_CLAIMED ->
       sc_t = rjt[me]; sc_i = IX(sc_t, svc); sc_job = rjob[me];
       if
       :: sc_job == J_FWD_NOLOG ->
          assert(inflight[sc_i] == 0); inflight[sc_i]++; phase = P_CALLING
       :: (sc_job == J_FWD && st[sc_i] == STARTED && att[sc_i] == jg) ||
          (sc_job == J_UNDO && st[sc_i] == COMPENSATING && uatt[sc_i] == jg) ->
          leased[sc_i] = 1; owner[sc_i] = me;
          assert(inflight[sc_i] == 0);   /* never two calls of one key in flight */
          inflight[sc_i]++; phase = P_CALLING
       :: else -> rjob[me] = J_NONE; phase = P_IDLE; jg = 0
       fi }
  /* the company answers (or not) */
  :: atomic { phase == P_CALLING ->
       sc_t = rjt[me]; sc_i = IX(sc_t, svc); sc_job = rjob[me];
       if
       :: sc_job == J_UNDO -> company_undo(sc_i, svc)
       :: else -> company_create(sc_i, svc)
       fi;
       inflight[sc_i]--; phase = P_ANSWERED }
  /* the answer and its event in one transaction */
  :: atomic { phase == P_ANSWERED ->
       sc_t = rjt[me]; sc_i = IX(sc_t, svc); sc_job = rjob[me];
       if
       :: sc_job == J_FWD -> record_forward(sc_i, sc_t, svc)
       :: sc_job == J_UNDO -> record_undo(sc_i, sc_t, svc)
       :: sc_job == J_FWD_NOLOG ->
          /* the bug: the row is written only now, with the answer */
          if
          :: st[sc_i] == NONE ->
             att[sc_i] = 1; st[sc_i] = STARTED; jg = 1; record_forward(sc_i, sc_t, svc)
          :: else -> skip
          fi
       fi;
       rjob[me] = J_NONE; phase = P_IDLE; res = 0; jg = 0 }
  /* SIGKILL with a sc_job in hand, and a restart: what is in memory is
   * lost; the database, the streams and the companies keep theirs. The
   * restart'sc_s recovery pass is the claims above. */
  :: atomic { crashes > 0 && (rjob[me] != J_NONE
#ifdef BUG_INBOX_APART
       || pend != 255
#endif
       ) ->
       crash() }
  od
}

/* time and the relay: outbox rows are published (any order: consumers
 * take what is published in any order), leases run out, deadlines
 * pass, late requests land */
#ifdef BUG_LEASE_LIVE
#define CALL_OVER(I) true
#else
#define CALL_OVER(I) (inflight[I] == 0)
#endif
/* the owner'sc_s sc_job is this row */
#define OWNER_ON(I, T) (rjob[owner[I]] != J_NONE && rjt[owner[I]] == T)
#define LEASE(T, S) \
  :: atomic { leased[IX(T, S)] && inflight[IX(T, S)] == 0 && !OWNER_ON(IX(T, S), T) -> leased[IX(T, S)] = 0 } \
  :: atomic { leased[IX(T, S)] && CALL_OVER(IX(T, S)) && OWNER_ON(IX(T, S), T) && faults > 0 -> \
       faults--; leased[IX(T, S)] = 0 /* a slow owner outlived its lease */ }
#define LATE(T, S) \
  :: atomic { late[IX(T, S)] -> company_late(IX(T, S), S) }

active proctype Env() {
end:
  do
  :: atomic { (outbox[0] & ~stream[0]) != 0 -> stream[0] = stream[0] | outbox[0] }
  LEASE(0, HOTEL) LEASE(0, PAY) LEASE(0, CAR) LEASE(0, MAIL)
  LATE(0, HOTEL) LATE(0, PAY) LATE(0, CAR)
#if NT > 1
  :: atomic { (outbox[1] & ~stream[1]) != 0 -> stream[1] = stream[1] | outbox[1] }
  LEASE(1, HOTEL) LEASE(1, PAY) LEASE(1, CAR) LEASE(1, MAIL)
  LATE(1, HOTEL) LATE(1, PAY) LATE(1, CAR)
#endif
  od
}

/* ---- the properties at quiescence (nothing can move: every event
 * handled, every row settled) ---- */
#define ACTIVE(sc_t, sc_s) (comp[IX(sc_t, sc_s)] == CA)
#define WHOLE(sc_t) (tstat[sc_t] == T_CONFIRMED && ACTIVE(sc_t, HOTEL) && ACTIVE(sc_t, PAY) && ACTIVE(sc_t, CAR) && \
                  mails[sc_t] == 1 && mailkind[sc_t] == T_CONFIRMED)
#define EMPTY(sc_t) (tstat[sc_t] == T_CANCELED && !ACTIVE(sc_t, HOTEL) && !ACTIVE(sc_t, PAY) && !ACTIVE(sc_t, CAR) && \
                  mails[sc_t] == 1 && mailkind[sc_t] == T_CANCELED)
/* canceling with an open undo incident: every record is undone but those
 * of the steps the trip names open, each with its incident open */
#define OPENOK(sc_t, sc_s) ((!ACTIVE(sc_t, sc_s) && (topen[sc_t] & (1 << sc_s)) == 0) || \
                      ((topen[sc_t] & (1 << sc_s)) != 0 && inc[IX(sc_t, sc_s)] == INC_REFUSED))
#define STUCK(sc_t) (tstat[sc_t] == T_CANCELING && topen[sc_t] != 0 && mails[sc_t] == 0 && \
                  OPENOK(sc_t, HOTEL) && OPENOK(sc_t, PAY) && OPENOK(sc_t, CAR))

/* A record that commits late, after its undo by key found nothing and
 * the trip settled canceled (its mail sent), is found by the
 * verification and undone again; if that undo is refused for good, the
 * incident is open and named but the trip'sc_s status stays canceled
 * (services/trips project() leaves a final status alone). The model
 * found this (docs/model.md, "Finding"); -DSTRICT refuses it. */
#define REOPENED(sc_t, sc_s) (!ACTIVE(sc_t, sc_s) || inc[IX(sc_t, sc_s)] == INC_REFUSED)
#ifdef STRICT
#define SETTLED_OPEN(sc_t) false
#else
#define SETTLED_OPEN(sc_t) (tstat[sc_t] == T_CANCELED && mails[sc_t] == 1 && mailkind[sc_t] == T_CANCELED && \
                         REOPENED(sc_t, HOTEL) && REOPENED(sc_t, PAY) && REOPENED(sc_t, CAR))
#endif

active proctype Quiescence() {
  timeout ->
  assert(WHOLE(0) || EMPTY(0) || STUCK(0) || SETTLED_OPEN(0));
#if NT > 1
  assert(WHOLE(1) || EMPTY(1) || STUCK(1) || SETTLED_OPEN(1));
  assert(rooms + (ACTIVE(0, HOTEL) -> 1 : 0) + (ACTIVE(1, HOTEL) -> 1 : 0) == 1);
#endif
}

init {
  byte r = 0;
  atomic {
    /* POST /trips: the trip row and trip.requested in one transaction */
    outbox[0] = B(E_TREQ);
#if NT > 1
    outbox[1] = B(E_TREQ);
#endif
    r = 0; do :: r < RH -> run Replica(HOTEL, 1 + r); r++ :: else -> break od;
    r = 0; do :: r < RP -> run Replica(PAY, 1 + RH + r); r++ :: else -> break od;
    r = 0; do :: r < RC -> run Replica(CAR, 1 + RH + RP + r); r++ :: else -> break od;
    run Replica(MAIL, 1 + RH + RP + RC)
  }
}
