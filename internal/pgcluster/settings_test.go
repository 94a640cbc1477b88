package pgcluster

import "testing"

func TestSettingOptions(t *testing.T) {
	got, err := settingOptions(map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"})
	if err != nil {
		t.Fatal(err)
	}
	want := " -c 'pg_stat_statements.track=all' -c 'shared_preload_libraries=pg_stat_statements'"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	for _, bad := range []map[string]string{{"a": "x'y"}, {"": "x"}, {"a b": "x"}, {"a": "x\ny"}} {
		if _, err := settingOptions(bad); err == nil {
			t.Errorf("settingOptions(%v) accepted", bad)
		}
	}
}
