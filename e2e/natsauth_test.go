package e2e

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

// TestIdentitiesEnforcedOnTheRunningSystem (issue 9 item 1): the NATS
// server of `tripsaga up` refuses an anonymous client, and the hotel's own
// identity (the seed up gave the hotel process) cannot publish a
// payment.charged: the server reports a permissions violation, PAYMENT
// stores nothing, and the car's consumer, which books a car on
// payment.charged, has nothing more to deliver.
func TestIdentitiesEnforcedOnTheRunningSystem(t *testing.T) {
	ctx := context.Background()
	_, err := nats.Connect(sys.NATSURL, nats.Timeout(5*time.Second))
	require.ErrorIs(t, err, nats.ErrAuthorization, "an anonymous client")

	admin, err := sys.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer admin.Close()
	ajs, err := jetstream.New(admin)
	require.NoError(t, err)
	payment, err := ajs.Stream(ctx, events.StreamPayment)
	require.NoError(t, err)
	before, err := payment.Info(ctx)
	require.NoError(t, err)

	var mu sync.Mutex
	var violations []error
	hotel, err := sys.ConnectNATS("hotel", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, err)
	}))
	require.NoError(t, err)
	defer hotel.Close()
	hjs, err := jetstream.New(hotel)
	require.NoError(t, err)
	forged := "payment.charged.T-forged-by-hotel"
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = hjs.Publish(pctx, forged, []byte(`{"trip_id":"T-forged-by-hotel"}`))
	require.Error(t, err, "the hotel published %s", forged)
	testenv.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			if errors.Is(v, nats.ErrPermissionViolation) && strings.Contains(v.Error(), forged) {
				return true
			}
		}
		return false
	}, "no permissions violation for %s", forged)

	_, err = payment.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(forged))
	require.Error(t, err, "PAYMENT holds the forged event")
	car, err := ajs.Consumer(ctx, events.StreamPayment, "car")
	require.NoError(t, err)
	ci, err := car.Info(ctx)
	require.NoError(t, err)
	for seq := before.State.LastSeq + 1; seq <= ci.Delivered.Stream; seq++ {
		m, err := payment.GetMsg(ctx, seq)
		if err == nil {
			require.NotEqual(t, forged, m.Subject, "the car's consumer was handed the forged event")
		}
	}
}
