package repository_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/watermill-idempotent/repository"
)

// FuzzStorageKey checks the properties every backend relies on: the
// stored form is deterministic, fits MaxKeyLength, is valid UTF-8 without
// NUL (PostgreSQL text refuses both), distinct keys stay distinct, and a
// hashed form never equals a key stored as it is.
func FuzzStorageKey(f *testing.F) {
	f.Add("order-1", "order-2")
	f.Add(strings.Repeat("k", repository.MaxKeyLength), strings.Repeat("k", repository.MaxKeyLength+1))
	f.Add("sha256:abc", "abc")
	f.Add("\xff\xfe", "\ufffd\ufffd")
	f.Add("", "sha256:")
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, sb := repository.StorageKey(a), repository.StorageKey(b)
		if sa != repository.StorageKey(a) {
			t.Fatalf("StorageKey(%q) is not deterministic", a)
		}
		if len(sa) > repository.MaxKeyLength || !utf8.ValidString(sa) {
			t.Fatalf("StorageKey(%q) = %q: longer than %d bytes or not UTF-8", a, sa, repository.MaxKeyLength)
		}
		if strings.ContainsRune(sa, 0) {
			t.Fatalf("StorageKey(%q) = %q contains NUL", a, sa)
		}
		if a != b && sa == sb {
			t.Fatalf("distinct keys %q and %q share the stored form %q", a, b, sa)
		}
		rawA, rawB := sa == a, sb == b
		if rawA != rawB && sa == sb {
			t.Fatalf("a hashed form equals a raw key: %q, %q -> %q", a, b, sa)
		}
		if !rawA && !strings.HasPrefix(sa, "sha256:") {
			t.Fatalf("StorageKey(%q) = %q: neither the key nor its hash", a, sa)
		}
	})
}
