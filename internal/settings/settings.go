// Package settings holds what every Config of the module does the same
// way: filling a default and reporting every problem at once.
package settings

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
)

// Default sets *v to def when *v is the zero value.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Invalid joins the problems found in the config named what ("inbox",
// "relay") into one error, or returns nil when there are none.
func Invalid(what string, errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid %s config: %w", what, err)
	}
	return nil
}

// Positive returns an error saying that the setting called name must be
// positive, or nil when v is.
func Positive[T ~int | ~int64](name string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%s must be positive, got %v", name, v)
	}
	return nil
}

// Logger sets *l to watermill.NopLogger when it is nil.
func Logger(l *watermill.LoggerAdapter) {
	if *l == nil {
		*l = watermill.NopLogger{}
	}
}
