// Package providertest is the contract suite of the outside companies: the
// hotel, the card processor, the car firm and the mail relay, as written in
// docs/contracts/providers.md. It checks an implementation over HTTP only,
// knowing nothing of how it is built, so the same suite runs against the
// project's simulators (package sim) and against any other implementation.
//
// Call [Run] from a test with the companies' base URLs (the values of
// HOTEL_URL, PAYMENTS_URL, CARS_URL and MAIL_URL) and the [Features] the
// implementation promises beyond the contract; tests of features it does not
// promise are skipped, and so is every company whose URL is empty:
//
//	func TestMyCompanies(t *testing.T) {
//		providertest.Run(t, providertest.Companies{
//			HotelURL:    "http://127.0.0.1:9000/hotel",
//			PaymentsURL: "http://127.0.0.1:9000/payments",
//		}, providertest.Features{DeclinedCardToken: "tok_declined"})
//	}
//
// [RunHotel], [RunPayments], [RunCars], [RunMail] and [RunInsurer] check
// one company.
//
// Without writing Go, point this package's own test at an implementation:
//
//	go test ./provider/providertest -count=1 -run TestExternal -args \
//		-hotel-url=http://host:9000/hotel -payments-url=http://host:9000/payments \
//		-cars-url=http://host:9000/cars -mail-url=http://host:9000/mail \
//		-faults -declined-card-token=tok_declined
//
// or set HOTEL_URL, PAYMENTS_URL, CARS_URL, MAIL_URL and CONTRACT_EXTERNAL=1
// (with CONTRACT_FAULTS=1 and CONTRACT_DECLINED_CARD_TOKEN as wanted).
//
// The suite only adds records; it never deletes any. Every record it makes
// belongs to a fresh trip id ("T-ct<random hex>") and a fresh Idempotency-Key
// derived from it ("T-ct…:hotel"), so it can run many times, in parallel,
// against a company that already holds other records. Its subtests run in
// parallel. It pages through whole lists (the contract does not promise a
// trip_id filter on hotel, card and car lists), so a company holding many
// records makes it slower, not wrong.
//
// Fault rules ([Features.Faults]) match the suite's own trip ids only, apply
// once, and are left in place: clearing them could disturb other tests
// running against the same company.
package providertest

import (
	"net/http"
	"testing"
	"time"
)

// Companies are the base URLs of the four companies, e.g.
// http://127.0.0.1:8080/hotel. An empty URL skips that company.
type Companies struct {
	HotelURL    string
	PaymentsURL string
	CarsURL     string
	MailURL     string
	// InsurerURL is the travel insurer (INSURER_URL), the company of the
	// optional insurance step.
	InsurerURL string
}

// Features are what an implementation promises beyond the contract, and
// knobs for implementations that need particular inputs. The zero value
// checks the contract alone.
type Features struct {
	// Faults: every company accepts fault rules at POST <base>/_faults, in
	// the format of the project's simulators (sim.Rule):
	// {"op":"hold","fault":"sold_out","match":{"trip_id":"T-1"},"times":1},
	// answered 201. It enables the tests of the business answers that need a
	// company to refuse: 409 sold out (hotel, car) and 402 declined (card).
	Faults bool
	// DeclinedCardToken is a card token the card processor always declines
	// (402). Empty skips the tests that need one.
	DeclinedCardToken string
	// CardToken is the card token of charges that should succeed. Empty: a
	// fresh token per test, "tok_ct_<trip id>", so that each statement the
	// suite reads holds only its own lines. A shared token works too: the
	// suite reads only the statement lines of its own trip ids.
	CardToken string
	// HTTPClient sends every request. Nil: a client of the suite's own.
	HTTPClient *http.Client
	// RequestTimeout bounds each request. Defaults to
	// [RequestTimeoutDefault].
	RequestTimeout time.Duration
}

// RequestTimeoutDefault is the default of [Features.RequestTimeout].
const RequestTimeoutDefault = 15 * time.Second

// Run checks all five companies, each in a parallel subtest named after it
// (Hotel, Payments, Cars, Mail, Insurer). A company with an empty URL is skipped.
func Run(t *testing.T, c Companies, f Features) {
	t.Helper()
	for _, co := range []struct {
		name string
		url  string
		run  func(*testing.T, string, Features)
	}{
		{"Hotel", c.HotelURL, RunHotel},
		{"Payments", c.PaymentsURL, RunPayments},
		{"Cars", c.CarsURL, RunCars},
		{"Mail", c.MailURL, RunMail},
		{"Insurer", c.InsurerURL, RunInsurer},
	} {
		t.Run(co.name, func(t *testing.T) {
			if co.url == "" {
				t.Skipf("no %s URL given", co.name)
			}
			t.Parallel()
			co.run(t, co.url, f)
		})
	}
}

// RunHotel checks the hotel at baseURL (POST /holds, release, GET, lists;
// sold out with [Features.Faults]).
func RunHotel(t *testing.T, baseURL string, f Features) {
	t.Helper()
	runRefusing(t, hotel(baseURL), f, "SoldOutIsReplayedByKey")
}

// RunPayments checks the card processor at baseURL (POST /charges, refund,
// GET, lists, statements; declines with [Features.DeclinedCardToken] or
// [Features.Faults]).
func RunPayments(t *testing.T, baseURL string, f Features) {
	t.Helper()
	s := newSuite(t, payments(baseURL, f.CardToken), f)
	s.runCommon(t)
	s.runUndoable(t)
	t.Run("MoneyIsEchoedAsIntegerMinorUnits", s.testMoney)
	t.Run("RefundAddsStatementLineAndKeepsCharge", s.testRefundStatement)
	t.Run("PartialRefundRefundsTheAmountOnce", s.testPartialRefund)
	t.Run("PartialRefundOverTheChargeIsRefused", s.testPartialRefundRefused)
	t.Run("DeclinedCardIsReplayedAndNotRefunded", s.testDeclinedCardToken)
	t.Run("DeclineRuleIsReplayedByKey", s.testDeclineRule)
}

// RunCars checks the car firm at baseURL (POST /bookings, cancel, GET,
// lists; sold out with [Features.Faults]).
func RunCars(t *testing.T, baseURL string, f Features) {
	t.Helper()
	runRefusing(t, cars(baseURL), f, "SoldOutIsReplayedByKey")
}

// RunInsurer checks the travel insurer at baseURL (POST /policies, cancel,
// GET, lists; a rejection with [Features.Faults]).
func RunInsurer(t *testing.T, baseURL string, f Features) {
	t.Helper()
	runRefusing(t, insurer(baseURL), f, "RejectionIsReplayedByKey")
}

// runRefusing checks a company that can undo and whose refusal is a 409
// fault rule (hotel, car firm, insurer): the common and undoable
// behaviours, and its refusal replayed by key in the subtest named refusal.
func runRefusing(t *testing.T, c company, f Features, refusal string) {
	t.Helper()
	s := newSuite(t, c, f)
	s.runCommon(t)
	s.runUndoable(t)
	t.Run(refusal, s.testSoldOut)
}

// RunMail checks the mail relay at baseURL (POST /messages, GET,
// GET /messages?trip_id=).
func RunMail(t *testing.T, baseURL string, f Features) {
	t.Helper()
	s := newSuite(t, mail(baseURL), f)
	s.runCommon(t)
	t.Run("ListsMessagesByTrip", s.testMailByTrip)
}

// runCommon runs the behaviours every company shares: create under an
// Idempotency-Key and status by key.
func (s *suite) runCommon(t *testing.T) {
	t.Run("CreateAnswersKeyIDAndStatus", s.testCreate)
	t.Run("SameKeySameBodyReplaysFirstAnswer", s.testReplay)
	t.Run("SameKeyDifferentBodyIsRefused", s.testKeyReused)
	t.Run("CreateWithoutKeyIsRefused", s.testMissingKey)
	t.Run("GetByKeyAnswersResource", s.testGet)
	t.Run("GetUnknownKeyAnswersNone", s.testGetUnknown)
}

// runUndoable runs the behaviours of the companies that can undo (hotel,
// card processor, car firm): undo by key and lists for reconciliation.
func (s *suite) runUndoable(t *testing.T) {
	t.Run("UndoByKeyAnswersUndoneStatus", s.testUndo)
	t.Run("UndoUnknownKeyAnswersNoneAndChangesNothing", s.testUndoUnknown)
	t.Run("ListPagesOldestFirstEachRecordOnce", s.testListPaging)
	t.Run("ListFiltersByStatus", s.testListStatus)
	t.Run("ListLimitIsAtMost1000", s.testListLimit)
}
