package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

func TestTripVersion(t *testing.T) {
	t.Run("IsTheSagaOrder", func(t *testing.T) {
		require.Equal(t, "hotel,payment,car", events.Default.Version())
		require.Equal(t, "hotel,insurance,payment,car", events.Full().Version())
		require.Equal(t, events.Default.Version(), events.DefaultVersion())
	})

	t.Run("TravelsAsAnExtensionThroughTheCodec", func(t *testing.T) {
		e, err := events.New(events.Source("trips"), events.TripRequested, "T-1", map[string]string{"trip_id": "T-1"})
		require.NoError(t, err)
		require.Empty(t, events.VersionOf(e), "an event of before versions has none")
		events.SetVersion(&e, "hotel,insurance,payment,car")
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		require.Equal(t, "hotel,insurance,payment,car", h["ce-tripsteps"], "its own header, no escape needed")
		hs := map[string][]string{}
		for k, v := range h {
			hs[k] = []string{v}
		}
		back, err := events.Decode(hs, e.Data())
		require.NoError(t, err)
		require.Equal(t, "hotel,insurance,payment,car", events.VersionOf(back))
	})

	t.Run("BuildsTheTripsCatalogue", func(t *testing.T) {
		c, err := events.CatalogueOf("")
		require.NoError(t, err)
		require.Equal(t, events.Default.Version(), c.Version(), "no version: the default order")
		c, err = events.CatalogueOf("hotel,insurance,payment,car")
		require.NoError(t, err)
		require.Equal(t, events.Run, c.ReactionOf("payment", events.InsuranceBought))
		require.Equal(t, events.Ignore, c.ReactionOf("payment", events.HotelHeld), "the insurer is between them")
		require.Equal(t, events.Undo, c.ReactionOf("hotel", events.InsuranceRejected))
		require.Equal(t, events.Ignore, c.ReactionOf("hotel", events.PaymentDeclined))
		d, _ := events.CatalogueOf("hotel,payment,car")
		require.Equal(t, events.Ignore, d.ReactionOf("insurance", events.HotelHeld), "no insurance in the trip")
		require.Equal(t, events.Run, d.ReactionOf("payment", events.HotelHeld))
	})

	t.Run("RefusesABadVersionNamingIt", func(t *testing.T) {
		for v, want := range map[string]string{
			"hotel,car":                   `step payment is missing`,
			"hotel,car,payment,insurance": `compensable step insurance comes after the pivot payment`,
			"hotel, payment,car":          `not canonical (want "hotel,payment,car")`,
			"hotel,payment,car,spa":       `unknown step "spa"`,
		} {
			_, err := events.CatalogueOf(v)
			require.ErrorIs(t, err, events.ErrInvalidCatalogue, v)
			require.ErrorContains(t, err, want, v)
			require.ErrorContains(t, err, "trip version", v)
		}
	})

	t.Run("EveryServiceListensForEveryVersion", func(t *testing.T) {
		var vs []string
		for _, c := range events.Versions() {
			vs = append(vs, c.Version())
		}
		require.Equal(t, []string{"hotel,payment,car", "hotel,car,payment",
			"insurance,hotel,payment,car", "hotel,insurance,payment,car", "hotel,payment,insurance,car",
			"insurance,hotel,car,payment", "hotel,insurance,car,payment", "hotel,car,insurance,payment"}, vs,
			"both declared orders, each with the insurance anywhere before its pivot")
		hotel := events.ConsumesAnyVersion("hotel")
		for _, typ := range []string{events.TripRequested, events.InsuranceBought, events.PaymentDeclined, events.InsuranceRejected, events.InsuranceCancelStuck, events.CarCanceled, events.CarRejected} {
			require.Contains(t, hotel, typ)
		}
		p, ok := events.ProjectionAnyVersion("trips")
		require.True(t, ok)
		require.Contains(t, p.Consumes, events.InsuranceCanceled, "the trips status follows an insured trip after STEPS dropped insurance")
		require.Contains(t, p.Consumes, events.CarCanceled, "and a charge-last trip after STEPS went back to the default order")
		require.Contains(t, events.ConsumesAnyVersion("car"), events.HotelHeld, "the car follows the hold in a charge-last trip")
	})
}
