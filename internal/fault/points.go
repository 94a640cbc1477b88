package fault

// Where a point is, the last part of its name.
const (
	// BeforeCall: the step log row is committed (started or
	// compensating) and the company has not been called yet (in the HTTP
	// client, before the request is sent). error: the request fails as a
	// lost connection would (unknown, asked again by key).
	BeforeCall = "before_call"
	// AnswerUnread: the company committed and its answer's status line and
	// headers have arrived; the body is not read yet. error: the answer
	// cannot be read (unknown, asked again by key).
	AnswerUnread = "answer_unread"
	// AfterCall: the answer is read and decided (a status by key asked if
	// it was unknown); the step log is not written yet. error: the answer
	// is not recorded, as when the database cannot be reached; the row's
	// lease runs out and it is asked again by key.
	AfterCall = "after_call"
	// AfterLog: the step log row with the answer and its event in the
	// outbox are committed; the event is not published yet (between two
	// compensations when the step is an undo; right after the pivot for
	// car.book). error: the event is not published at once, as when the
	// local publish fails; every relay claims it after LocalGrace (5 s).
	AfterLog = "after_log"
	// AfterPublish: JetStream acked an outbox event (PubAck) and its row
	// is not marked sent yet, in the writer's local publish and in the
	// batch relay. error: the row is not marked; it is claimed and
	// published again, and the duplicate window drops the copy.
	AfterPublish = "after_publish"
	// AfterCommit: an inbox committed the handling of an event (and its
	// after-commit work began) and has not acked it yet, one by one and in
	// batches. error: the ack is lost; the server redelivers after
	// AckWait and the inbox acks the duplicate.
	AfterCommit = "after_commit"
)

// The points, "<service>.<step>.<where>". The step of a company call is
// its operation: hold/release (hotel), charge/refund (payment),
// book/cancel (car: cancel is the undo by key of a booking unknown at the
// deadline), buy/cancel (insurance, the optional step: cancel is its
// compensation and its undo by key at the deadline alike) and mail (trips'
// confirmation or cancellation email).
const (
	HotelHoldBeforeCall      = "hotel.hold.before_call"
	HotelHoldAnswerUnread    = "hotel.hold.answer_unread"
	HotelHoldAfterCall       = "hotel.hold.after_call"
	HotelHoldAfterLog        = "hotel.hold.after_log"
	HotelReleaseBeforeCall   = "hotel.release.before_call"
	HotelReleaseAnswerUnread = "hotel.release.answer_unread"
	HotelReleaseAfterCall    = "hotel.release.after_call"
	HotelReleaseAfterLog     = "hotel.release.after_log"

	PaymentChargeBeforeCall   = "payment.charge.before_call"
	PaymentChargeAnswerUnread = "payment.charge.answer_unread"
	PaymentChargeAfterCall    = "payment.charge.after_call"
	PaymentChargeAfterLog     = "payment.charge.after_log"
	PaymentRefundBeforeCall   = "payment.refund.before_call"
	PaymentRefundAnswerUnread = "payment.refund.answer_unread"
	PaymentRefundAfterCall    = "payment.refund.after_call"
	PaymentRefundAfterLog     = "payment.refund.after_log"

	CarBookBeforeCall     = "car.book.before_call"
	CarBookAnswerUnread   = "car.book.answer_unread"
	CarBookAfterCall      = "car.book.after_call"
	CarBookAfterLog       = "car.book.after_log" // right after the pivot: booked and logged, trip not yet confirmed
	CarCancelBeforeCall   = "car.cancel.before_call"
	CarCancelAnswerUnread = "car.cancel.answer_unread"
	CarCancelAfterCall    = "car.cancel.after_call"
	CarCancelAfterLog     = "car.cancel.after_log"

	// The optional insurance step (STEPS=hotel,insurance,payment,car):
	// the policy bought, and canceled as the compensation (on the
	// payment's endings) or by key at the step's deadline.
	InsuranceBuyBeforeCall      = "insurance.buy.before_call"
	InsuranceBuyAnswerUnread    = "insurance.buy.answer_unread"
	InsuranceBuyAfterCall       = "insurance.buy.after_call"
	InsuranceBuyAfterLog        = "insurance.buy.after_log"
	InsuranceCancelBeforeCall   = "insurance.cancel.before_call"
	InsuranceCancelAnswerUnread = "insurance.cancel.answer_unread"
	InsuranceCancelAfterCall    = "insurance.cancel.after_call"
	InsuranceCancelAfterLog     = "insurance.cancel.after_log"

	TripsMailBeforeCall   = "trips.mail.before_call"
	TripsMailAnswerUnread = "trips.mail.answer_unread"
	TripsMailAfterCall    = "trips.mail.after_call"
	TripsMailAfterLog     = "trips.mail.after_log"

	// The traveler's other mails (services/trips): the delay notice of a
	// trip still canceling and the correction of a confirmed trip an
	// operator repaired (e2e TestTravelerMails fires them).
	TripsNoticeMailBeforeCall       = "trips.notice_mail.before_call"
	TripsNoticeMailAnswerUnread     = "trips.notice_mail.answer_unread"
	TripsNoticeMailAfterCall        = "trips.notice_mail.after_call"
	TripsNoticeMailAfterLog         = "trips.notice_mail.after_log"
	TripsCorrectionMailBeforeCall   = "trips.correction_mail.before_call"
	TripsCorrectionMailAnswerUnread = "trips.correction_mail.answer_unread"
	TripsCorrectionMailAfterCall    = "trips.correction_mail.after_call"
	TripsCorrectionMailAfterLog     = "trips.correction_mail.after_log"

	// The traveler's cancellation of a confirmed trip: each service's
	// forward-only undo by the booking's key (events.TripCancellationRequested).
	HotelTravelerReleaseBeforeCall    = "hotel.traveler_release.before_call"
	HotelTravelerReleaseAnswerUnread  = "hotel.traveler_release.answer_unread"
	HotelTravelerReleaseAfterCall     = "hotel.traveler_release.after_call"
	HotelTravelerReleaseAfterLog      = "hotel.traveler_release.after_log"
	PaymentTravelerRefundBeforeCall   = "payment.traveler_refund.before_call"
	PaymentTravelerRefundAnswerUnread = "payment.traveler_refund.answer_unread"
	PaymentTravelerRefundAfterCall    = "payment.traveler_refund.after_call"
	PaymentTravelerRefundAfterLog     = "payment.traveler_refund.after_log"
	CarTravelerCancelBeforeCall       = "car.traveler_cancel.before_call"
	CarTravelerCancelAnswerUnread     = "car.traveler_cancel.answer_unread"
	CarTravelerCancelAfterCall        = "car.traveler_cancel.after_call"
	CarTravelerCancelAfterLog         = "car.traveler_cancel.after_log"
	TripsTravelerMailBeforeCall       = "trips.traveler_mail.before_call"
	TripsTravelerMailAnswerUnread     = "trips.traveler_mail.answer_unread"
	TripsTravelerMailAfterCall        = "trips.traveler_mail.after_call"
	TripsTravelerMailAfterLog         = "trips.traveler_mail.after_log"

	TripsRelayAfterPublish     = "trips.relay.after_publish"
	HotelRelayAfterPublish     = "hotel.relay.after_publish"
	PaymentRelayAfterPublish   = "payment.relay.after_publish"
	CarRelayAfterPublish       = "car.relay.after_publish"
	InsuranceRelayAfterPublish = "insurance.relay.after_publish"

	TripsInboxAfterCommit      = "trips.inbox.after_commit"
	HotelInboxAfterCommit      = "hotel.inbox.after_commit"
	PaymentInboxAfterCommit    = "payment.inbox.after_commit"
	CarInboxAfterCommit        = "car.inbox.after_commit"
	InsuranceInboxAfterCommit  = "insurance.inbox.after_commit"
	ReconcilerInboxAfterCommit = "reconciler.inbox.after_commit"

	// ReconcilerReplayAfterClear is in `tripsaga replay reconciler`,
	// right after the transaction that cleared the view committed.
	ReconcilerReplayAfterClear = "reconciler.replay.after_clear"
)

// Points lists every point, the ones a rule may name.
var Points = []string{ //nolint:gochecknoglobals // read-only
	HotelHoldBeforeCall, HotelHoldAnswerUnread, HotelHoldAfterCall, HotelHoldAfterLog,
	HotelReleaseBeforeCall, HotelReleaseAnswerUnread, HotelReleaseAfterCall, HotelReleaseAfterLog,
	PaymentChargeBeforeCall, PaymentChargeAnswerUnread, PaymentChargeAfterCall, PaymentChargeAfterLog,
	PaymentRefundBeforeCall, PaymentRefundAnswerUnread, PaymentRefundAfterCall, PaymentRefundAfterLog,
	CarBookBeforeCall, CarBookAnswerUnread, CarBookAfterCall, CarBookAfterLog,
	CarCancelBeforeCall, CarCancelAnswerUnread, CarCancelAfterCall, CarCancelAfterLog,
	InsuranceBuyBeforeCall, InsuranceBuyAnswerUnread, InsuranceBuyAfterCall, InsuranceBuyAfterLog,
	InsuranceCancelBeforeCall, InsuranceCancelAnswerUnread, InsuranceCancelAfterCall, InsuranceCancelAfterLog,
	TripsMailBeforeCall, TripsMailAnswerUnread, TripsMailAfterCall, TripsMailAfterLog,
	TripsNoticeMailBeforeCall, TripsNoticeMailAnswerUnread, TripsNoticeMailAfterCall, TripsNoticeMailAfterLog,
	TripsCorrectionMailBeforeCall, TripsCorrectionMailAnswerUnread, TripsCorrectionMailAfterCall, TripsCorrectionMailAfterLog,
	HotelTravelerReleaseBeforeCall, HotelTravelerReleaseAnswerUnread, HotelTravelerReleaseAfterCall, HotelTravelerReleaseAfterLog,
	PaymentTravelerRefundBeforeCall, PaymentTravelerRefundAnswerUnread, PaymentTravelerRefundAfterCall, PaymentTravelerRefundAfterLog,
	CarTravelerCancelBeforeCall, CarTravelerCancelAnswerUnread, CarTravelerCancelAfterCall, CarTravelerCancelAfterLog,
	TripsTravelerMailBeforeCall, TripsTravelerMailAnswerUnread, TripsTravelerMailAfterCall, TripsTravelerMailAfterLog,
	TripsRelayAfterPublish, HotelRelayAfterPublish, PaymentRelayAfterPublish, CarRelayAfterPublish, InsuranceRelayAfterPublish,
	TripsInboxAfterCommit, HotelInboxAfterCommit, PaymentInboxAfterCommit, CarInboxAfterCommit, InsuranceInboxAfterCommit, ReconcilerInboxAfterCommit,
	ReconcilerReplayAfterClear,
}

// Process returns the process a point is in: its first part.
func Process(point string) string {
	for i := range len(point) {
		if point[i] == '.' {
			return point[:i]
		}
	}
	return point
}
