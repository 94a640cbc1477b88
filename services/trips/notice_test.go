package trips

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CANCELING_NOTICE_AFTER_MS: unset is ten minutes; a positive integer of
// ms is taken; anything else is an error naming the variable.
func TestNoticeAfterFromEnv(t *testing.T) {
	t.Setenv(NoticeAfterVar, "")
	d, err := NoticeAfterFromEnv()
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, d)
	t.Setenv(NoticeAfterVar, "1500")
	d, err = NoticeAfterFromEnv()
	require.NoError(t, err)
	require.Equal(t, 1500*time.Millisecond, d)
	for _, bad := range []string{"0", "-5", "10m", "1.5", "99999999999999999999"} {
		t.Setenv(NoticeAfterVar, bad)
		_, err := NoticeAfterFromEnv()
		require.ErrorContains(t, err, NoticeAfterVar+"=", bad)
	}
	require.Equal(t, 100*time.Millisecond, noticeEvery(time.Second), "at least 100 ms")
	require.Equal(t, 5*time.Second, noticeEvery(10*time.Minute), "at most 5 s")
}

// The mail relay's keys tell the final mail from the notice and the
// correction, by their suffix.
func TestMailKind(t *testing.T) {
	for key, want := range map[string]string{
		"T-1:mail:confirmed": "final", "T-1:mail:canceled": "final", "T-1:mail:canceled_by_traveler": "final",
		"T-1:mail:again": "final", "T-1:mail:delayed": "notice", "T-1:mail:correction": "correction",
	} {
		require.Equal(t, want, MailKind(key), key)
		require.Equal(t, want == "final", IsFinalMailKey(key), key)
	}
}
