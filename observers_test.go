package tierlimit_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// sample returns a value of typ whose exported fields of basic kinds, in
// structs at any depth, are not zero: what a fan-out passes on is then
// told apart from a zero value it would make up.
func sample(typ reflect.Type) reflect.Value {
	v := reflect.New(typ).Elem()
	fillSample(v)
	return v
}

func fillSample(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillSample(v.Field(i))
			}
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(2)
	case reflect.String:
		v.SetString("x")
	}
}

// TestObserversEveryField checks, by reflection over Observer, that
// Observers fans out every field: a field added to Observer and not to
// Observers fails here. Each field of the fan-out of two Observers calls
// both, in order, with the value it is given; of one, is that one's func;
// of none, is nil.
func TestObserversEveryField(t *testing.T) {
	typ := reflect.TypeFor[tierlimit.Observer]()
	for i := range typ.NumField() {
		field := typ.Field(i)
		t.Run(field.Name, func(t *testing.T) {
			ft := field.Type
			if ft.Kind() != reflect.Func || ft.NumIn() != 1 || ft.NumOut() != 0 {
				t.Fatalf("Observer.%s is a %v, want a func of one argument and no result: Observers and this test must learn it", field.Name, ft)
			}
			arg := sample(ft.In(0))
			var got []string
			observer := func(name string) *tierlimit.Observer {
				o := new(tierlimit.Observer)
				reflect.ValueOf(o).Elem().Field(i).Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
					if !reflect.DeepEqual(args[0].Interface(), arg.Interface()) {
						t.Errorf("%s got %+v, want %+v", name, args[0].Interface(), arg.Interface())
					}
					got = append(got, name)
					return nil
				}))
				return o
			}
			fieldOf := func(o *tierlimit.Observer) reflect.Value { return reflect.ValueOf(o).Elem().Field(i) }

			both := fieldOf(tierlimit.Observers(observer("a"), nil, new(tierlimit.Observer), observer("b")))
			if both.IsNil() {
				t.Fatalf("Observers(a, b).%s is nil: not fanned out", field.Name)
			}
			both.Call([]reflect.Value{arg})
			if want := []string{"a", "b"}; !slices.Equal(got, want) {
				t.Errorf("Observers(a, b).%s called %v, want %v", field.Name, got, want)
			}

			got = nil
			one := fieldOf(tierlimit.Observers(new(tierlimit.Observer), observer("a")))
			if one.IsNil() {
				t.Fatalf("Observers(a).%s is nil: not fanned out", field.Name)
			}
			one.Call([]reflect.Value{arg})
			if want := []string{"a"}; !slices.Equal(got, want) {
				t.Errorf("Observers(a).%s called %v, want %v", field.Name, got, want)
			}

			if none := fieldOf(tierlimit.Observers(new(tierlimit.Observer), nil)); !none.IsNil() {
				t.Errorf("Observers of no %s: the field is set, want nil", field.Name)
			}
		})
	}
	if o := tierlimit.Observers(); o == nil {
		t.Error("Observers() = nil, want an Observer that observes nothing")
	}
}

// ExampleObservers shows one limiter observed by two sinks, such as a
// Prometheus collector's Observer and an OpenTelemetry bridge's.
func ExampleObservers() {
	count := func(name string) *tierlimit.Observer {
		return &tierlimit.Observer{Decision: func(d tierlimit.Decision) {
			fmt.Printf("%s: allowed %v by %v\n", name, d.Allowed, d.Limit)
		}}
	}
	lim, err := local.New(tierlimit.PerSecond(1), local.WithObserver(tierlimit.Observers(count("prometheus"), count("otel"))))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	lim.AllowN(context.Background(), "k", 1)
	lim.AllowN(context.Background(), "k", 1)
	// Output:
	// prometheus: allowed true by 1/1s
	// otel: allowed true by 1/1s
	// prometheus: allowed false by 1/1s
	// otel: allowed false by 1/1s
}
