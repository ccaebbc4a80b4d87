// Package kafkaproducer turns on Kafka's idempotent producer in a Sarama
// configuration, for watermill-kafka's publisher:
//
//	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
//		Brokers:               brokers,
//		Marshaler:             kafka.DefaultMarshaler{},
//		OverwriteSaramaConfig: kafkaproducer.Idempotent(kafka.DefaultSaramaSyncPublisherConfig()),
//	}, logger)
//
// Without it, a produce request the broker applied but whose answer the
// producer did not get (a dropped connection, a request timeout) is sent
// again and stored twice: each copy is a duplicate the consumers' inbox
// must absorb. With it, the broker recognises the retry by the producer
// id and sequence number and stores it once. It covers one producer
// session's retries only: a process that restarts and publishes again, or
// an application that calls Publish twice, still makes copies — which is
// what the inbox is for. See docs/brokers.md.
package kafkaproducer

import "github.com/IBM/sarama"

// Idempotent sets sc up for Sarama's idempotent producer and returns it:
// Producer.Idempotent, with the settings Sarama refuses it without —
// RequiredAcks WaitForAll (every in-sync replica has the batch before it
// is acknowledged), Net.MaxOpenRequests 1 (Sarama keeps a partition's
// sequence in order only with one request in flight), Producer.Retry.Max
// at least 1 (10 unless sc already has more) — and a protocol Version of
// at least Kafka 0.11.0, which introduced it (sc's own when newer). kfake
// accepts Sarama up to V2_3_0_0.
func Idempotent(sc *sarama.Config) *sarama.Config {
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	if sc.Producer.Retry.Max < 1 {
		sc.Producer.Retry.Max = 10
	}
	if !sc.Version.IsAtLeast(sarama.V0_11_0_0) {
		sc.Version = sarama.V0_11_0_0
	}
	return sc
}
