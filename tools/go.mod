module github.com/idemkit/watermill-idempotent/tools

go 1.26.0
