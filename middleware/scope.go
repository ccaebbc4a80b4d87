package middleware

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/repository"
)

// ScopeSeparator joins Config.Consumer and the handler name into a
// delivery's scope: Consumer "shop" and handler "billing" give
// "shop/billing".
const ScopeSeparator = "/"

var (
	// ErrNoScope is returned for a delivery that has no scope: it carries
	// no Watermill handler name (the middleware was called outside a
	// router) and the inbox has no Consumer. It is permanent: add the inbox
	// to a router (router.AddMiddleware or handler.AddMiddleware) or set
	// Consumer.
	ErrNoScope = errors.New("delivery has no inbox scope")
	// ErrInvalidScope is returned for a delivery whose scope, derived from
	// its handler name, cannot be stored: longer than
	// repository.MaxConsumerLength bytes, not valid UTF-8, or containing a
	// NUL byte. It is permanent: every delivery of that handler fails the
	// same way until the handler is renamed or mapped with HandlerScopes.
	ErrInvalidScope = errors.New("invalid inbox scope")
)

// scoping resolves the scope of each delivery, the consumer part of the
// (consumer, key) a record is stored under. The rule, for a delivery of
// the Watermill handler h (message.HandlerNameFromCtx):
//
//   - HandlerScopes[h], if present;
//   - else h when Consumer is empty, Consumer + ScopeSeparator + h when it
//     is set;
//   - a delivery without a handler name (the middleware called directly)
//     uses Consumer alone, and fails with ErrNoScope if it is empty.
//
// Two handlers of one router therefore never share a scope unless
// HandlerScopes maps them to the same one on purpose.
type scoping struct {
	consumer string
	handlers map[string]string
}

func newScoping(consumer string, handlerScopes map[string]string) scoping {
	s := scoping{consumer: consumer}
	if len(handlerScopes) > 0 {
		// A copy: the caller's map may change after construction.
		s.handlers = make(map[string]string, len(handlerScopes))
		for h, scope := range handlerScopes {
			s.handlers[h] = scope
		}
	}
	return s
}

// resolve returns the scope of the delivery whose context is ctx, or an
// error wrapping ErrNoScope or ErrInvalidScope.
func (s scoping) resolve(ctx context.Context) (string, error) {
	handler := message.HandlerNameFromCtx(ctx)
	if handler == "" {
		if s.consumer == "" {
			return "", fmt.Errorf("%w: the message carries no Watermill handler name and the inbox has no Consumer; "+
				"add the inbox to a router (router.AddMiddleware or handler.AddMiddleware) or set Consumer", ErrNoScope)
		}
		return s.consumer, nil // checked at construction
	}
	if scope, ok := s.handlers[handler]; ok {
		return scope, nil // checked at construction
	}
	scope := handler
	if s.consumer != "" {
		scope = s.consumer + ScopeSeparator + handler
	}
	if err := checkScope(scope); err != nil {
		return "", fmt.Errorf("%w: scope %q of handler %q %w; rename the handler or map it with HandlerScopes", ErrInvalidScope, scope, handler, err)
	}
	return scope, nil
}

// fallback names a delivery whose scope could not be resolved, in logs
// and metrics: the Consumer, which is valid, possibly empty.
func (s scoping) fallback() string { return s.consumer }

// checkScope tells why scope cannot be stored as a consumer, or nil.
func checkScope(scope string) error {
	switch {
	case scope == "":
		return errors.New("is empty")
	case len(scope) > repository.MaxConsumerLength:
		return fmt.Errorf("is %d bytes, longer than %d", len(scope), repository.MaxConsumerLength)
	case !utf8.ValidString(scope):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(scope, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}

// validateScoping checks Consumer and HandlerScopes of the config named
// configName.
func validateScoping(configName, consumer string, handlerScopes map[string]string) []error {
	var errs []error
	if consumer != "" {
		if err := checkScope(consumer); err != nil {
			errs = append(errs, fmt.Errorf("%s.Consumer %w", configName, err))
		}
	}
	handlers := make([]string, 0, len(handlerScopes))
	for h := range handlerScopes {
		handlers = append(handlers, h)
	}
	sort.Strings(handlers) // stable error text
	for _, h := range handlers {
		if h == "" {
			errs = append(errs, fmt.Errorf("%s.HandlerScopes: the empty handler name never matches a delivery", configName))
			continue
		}
		if err := checkScope(handlerScopes[h]); err != nil {
			errs = append(errs, fmt.Errorf("%s.HandlerScopes[%q] %w", configName, h, err))
		}
	}
	return errs
}
