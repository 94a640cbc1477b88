package sim

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/tripsaga/tripsaga/sim/internal/dbsqlc"
)

// memStore keeps a company's records in memory, for benchmarks that must
// not spend the database's CPU on the companies. One mutex serializes the
// company's writes, which also gives create and undo their atomicity.
type memStore struct {
	mu      sync.Mutex
	idem    map[string]*dbsqlc.Idempotency
	byKey   map[string]*dbsqlc.Record
	ids     map[string]bool
	records []*dbsqlc.Record // in seq order
	lines   map[string][]dbsqlc.StatementLine
	lineKey map[string]bool // charge_key + "/" + kind, unique as in SQL
	seq     int64
	lineSeq int64
}

func newMemStore() *memStore {
	return &memStore{
		idem: map[string]*dbsqlc.Idempotency{}, byKey: map[string]*dbsqlc.Record{}, ids: map[string]bool{},
		lines: map[string][]dbsqlc.StatementLine{}, lineKey: map[string]bool{},
	}
}

func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// memTx stages writes; they are applied only when the transaction's
// function succeeds. The caller holds memStore.mu.
type memTx struct {
	s      *memStore
	apply  []func()
	staged map[string]*dbsqlc.Record // records written in this transaction, by key
}

func (t *memTx) insertRecord(_ context.Context, p dbsqlc.RecordInsertParams) (dbsqlc.Record, error) {
	if t.s.byKey[p.Key] != nil || t.staged[p.Key] != nil {
		return dbsqlc.Record{}, fmt.Errorf("record %s: key exists", p.Key)
	}
	if t.s.ids[p.ID] {
		return dbsqlc.Record{}, fmt.Errorf("record %s: id %s exists", p.Key, p.ID)
	}
	t.s.seq++
	at := now()
	rec := &dbsqlc.Record{Seq: t.s.seq, Key: p.Key, ID: p.ID, TripID: p.TripID, Status: p.Status,
		Request: p.Request, Reason: p.Reason, CreatedAt: at, UpdatedAt: at}
	t.staged[p.Key] = rec
	t.apply = append(t.apply, func() {
		t.s.byKey[rec.Key] = rec
		t.s.ids[rec.ID] = true
		t.s.records = append(t.s.records, rec)
	})
	return *rec, nil
}

func (t *memTx) setStatus(_ context.Context, p dbsqlc.RecordSetStatusParams) (dbsqlc.Record, error) {
	cur := t.staged[p.Key]
	if cur == nil {
		cur = t.s.byKey[p.Key]
	}
	if cur == nil {
		return dbsqlc.Record{}, fmt.Errorf("record %s: %w", p.Key, errNotFound)
	}
	next := *cur
	next.Status = p.Status
	if p.UndoID != nil {
		next.UndoID = p.UndoID
	}
	if p.RefundedCents.Valid {
		next.RefundedCents = p.RefundedCents
	}
	next.UpdatedAt = now()
	t.staged[p.Key] = &next
	t.apply = append(t.apply, func() {
		// Records are shared by pointer with the seq-ordered slice.
		*t.s.byKey[p.Key] = next
	})
	return next, nil
}

func (t *memTx) insertStatementLine(_ context.Context, p dbsqlc.StatementLineInsertParams) error {
	uk := p.ChargeKey + "/" + p.Kind
	if t.s.lineKey[uk] {
		return fmt.Errorf("statement line %s: exists", uk)
	}
	t.apply = append(t.apply, func() {
		t.s.lineSeq++
		t.s.lineKey[uk] = true
		t.s.lines[p.CardToken] = append(t.s.lines[p.CardToken], dbsqlc.StatementLine{
			Seq: t.s.lineSeq, CardToken: p.CardToken, ChargeKey: p.ChargeKey, TripID: p.TripID,
			AmountCents: p.AmountCents, Currency: p.Currency, Kind: p.Kind, At: now(),
		})
	})
	return nil
}

func (t *memTx) commit() {
	for _, f := range t.apply {
		f()
	}
}

func (s *memStore) create(_ context.Context, claim dbsqlc.IdempotencyClaimParams, fn func(w storeTx) (answer, error)) (dbsqlc.Idempotency, bool, answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.idem[claim.Key]; i != nil {
		return *i, true, answer{}, nil
	}
	tx := &memTx{s: s, staged: map[string]*dbsqlc.Record{}}
	a, err := fn(tx)
	if err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, err
	}
	tx.commit()
	s.idem[claim.Key] = &dbsqlc.Idempotency{Key: claim.Key, Op: claim.Op, Fingerprint: claim.Fingerprint,
		Request: claim.Request, StatusCode: int32(a.status), Response: a.body, CreatedAt: now()}
	return dbsqlc.Idempotency{}, false, a, nil
}

func (s *memStore) undo(_ context.Context, key string, fn func(rec *dbsqlc.Record, w storeTx) (answer, error)) (answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var recp *dbsqlc.Record
	if r := s.byKey[key]; r != nil {
		cp := *r
		recp = &cp
	}
	tx := &memTx{s: s, staged: map[string]*dbsqlc.Record{}}
	a, err := fn(recp, tx)
	if err != nil {
		return answer{}, err
	}
	tx.commit()
	return a, nil
}

func (s *memStore) idempotency(_ context.Context, key string) (dbsqlc.Idempotency, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.idem[key]; i != nil {
		return *i, nil
	}
	return dbsqlc.Idempotency{}, errNotFound
}

func (s *memStore) record(_ context.Context, key string) (dbsqlc.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byKey[key]; r != nil {
		return *r, nil
	}
	return dbsqlc.Record{}, errNotFound
}

// list pages like the SQL query RecordList: seq after AfterSeq, optional
// status and trip_id filters, at most MaxRows, oldest first.
func (s *memStore) list(_ context.Context, p dbsqlc.RecordListParams) ([]dbsqlc.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.records), func(i int) bool { return s.records[i].Seq > p.AfterSeq })
	var out []dbsqlc.Record
	for ; i < len(s.records) && len(out) < int(p.MaxRows); i++ {
		r := s.records[i]
		if (p.Status != nil && r.Status != *p.Status) || (p.TripID != nil && r.TripID != *p.TripID) {
			continue
		}
		out = append(out, *r)
	}
	return out, nil
}

func (s *memStore) statement(_ context.Context, cardToken string) ([]dbsqlc.StatementLine, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]dbsqlc.StatementLine(nil), s.lines[cardToken]...), nil
}

func (s *memStore) ping(context.Context) error { return nil }

func (s *memStore) close() {}
