package middleware

import (
	"context"
	"fmt"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
)

// ScopeSeparator joins Config.Consumer and the handler name into a
// delivery's scope: Consumer "payments" and handler "billing" give
// "payments/billing".
const ScopeSeparator = "/"

// scoping resolves the scope of each delivery, the consumer part of the
// (consumer, key) a record is stored under. The rule, for a delivery of
// the Watermill handler h (message.HandlerNameFromCtx):
//
//   - HandlerScopes[h], if present;
//   - else Consumer + ScopeSeparator + h (h alone when Consumer is empty,
//     which only NaturalKey, which stores nothing, allows);
//   - a delivery without a handler name (the middleware called directly)
//     uses Consumer alone, and fails with idempotency.ErrNoScope if it is empty.
//
// Two handlers of one router, or of two services with their own Consumer,
// therefore never share a scope unless HandlerScopes maps them to the same
// one on purpose.
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
// error wrapping idempotency.ErrNoScope or idempotency.ErrInvalidScope.
func (s scoping) resolve(ctx context.Context) (string, error) {
	handler := message.HandlerNameFromCtx(ctx)
	if handler == "" {
		if s.consumer == "" {
			return "", fmt.Errorf("%w: the message carries no Watermill handler name and the inbox has no Consumer; "+
				"add the inbox to a router (router.AddMiddleware or handler.AddMiddleware) or set Consumer", idempotency.ErrNoScope)
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
	if err := protocol.CheckScope(scope); err != nil {
		return "", fmt.Errorf("%w: scope %q of handler %q %w; rename the handler or map it with HandlerScopes", idempotency.ErrInvalidScope, scope, handler, err)
	}
	return scope, nil
}

// fallback names a delivery whose scope could not be resolved, in logs
// and metrics: the Consumer, which is valid, possibly empty.
func (s scoping) fallback() string { return s.consumer }

// validateScoping checks Consumer and HandlerScopes of the config named
// configName; an inbox's config requires a Consumer.
func validateScoping(configName, consumer string, handlerScopes map[string]string, required bool) []error {
	var errs []error
	switch {
	case consumer != "":
		if err := protocol.CheckScope(consumer); err != nil {
			errs = append(errs, fmt.Errorf("%s.Consumer %w", configName, err))
		}
	case required:
		errs = append(errs, fmt.Errorf("missing %s.Consumer: set it to the name of this service (\"payments\"), "+
			"so that services sharing the inbox table never suppress each other's messages: "+
			"records are scoped by Consumer and handler name, and without Consumer two services with a handler "+
			"of the same name, consuming the same messages, would acknowledge each other's as duplicates. "+
			"To keep the keys stored before Consumer was required (under the bare handler name), "+
			"also map each handler to its old scope: HandlerScopes: map[string]string{\"billing\": \"billing\"}", configName))
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
		if err := protocol.CheckScope(handlerScopes[h]); err != nil {
			errs = append(errs, fmt.Errorf("%s.HandlerScopes[%q] %w", configName, h, err))
		}
	}
	return errs
}
