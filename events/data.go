package events

import "reflect"

// The AsyncAPI document of the events (asyncapi.yaml beside this file) is
// generated from [Default] and the data types below; CI fails when it is
// stale.
//go:generate go run ./cmd/asyncapi -o asyncapi.yaml

// dataTypes maps the names [EventType.Data] may use to their Go types.
var dataTypes = map[string]reflect.Type{ //nolint:gochecknoglobals // read-only table
	"TripRequestedData":  reflect.TypeFor[TripRequestedData](),
	"StepData":           reflect.TypeFor[StepData](),
	"TripSettledData":    reflect.TypeFor[TripSettledData](),
	"CancellationData":   reflect.TypeFor[CancellationData](),
	"OperatorActionData": reflect.TypeFor[OperatorActionData](),
}

// DataType returns the Go type an [EventType.Data] name stands for, and
// false when the name is not one of the data types of this package.
func DataType(name string) (reflect.Type, bool) {
	t, ok := dataTypes[name]
	return t, ok
}
