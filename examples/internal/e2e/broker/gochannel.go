package broker

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// sharedGroup is a GoChannel subscription shared by a group's subscribers:
// GoChannel gives every subscription every message, so competing
// consumers read from one.
type sharedGroup struct {
	messages <-chan *message.Message
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the forwarders of every member
}

func (b *Broker) goChannelGroup(topic, group string) (*sharedGroup, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errors.New("broker is closed")
	}
	key := topic + "\x00" + group
	if g, ok := b.groups[key]; ok {
		return g, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := b.goChannel.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		return nil, err
	}
	g := &sharedGroup{messages: msgs, cancel: cancel}
	b.groups[key] = g
	return g, nil
}

// goChannelSubscriber is one member of a group on GoChannel.
type goChannelSubscriber struct {
	broker *Broker
	group  string

	mu      sync.Mutex
	closing chan struct{}
	closed  bool
	wg      sync.WaitGroup
}

func (s *goChannelSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("subscriber is closed")
	}
	if s.closing == nil {
		s.closing = make(chan struct{})
	}
	g, err := s.broker.goChannelGroup(topic, s.group)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	closing := s.closing
	s.wg.Add(1)
	g.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer g.wg.Done()
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-closing:
				return
			case msg, ok := <-g.messages:
				if !ok {
					return
				}
				select {
				case out <- msg:
				case <-ctx.Done():
					msg.Nack() // another member gets it
					return
				case <-closing:
					msg.Nack()
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *goChannelSubscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.closing != nil {
		close(s.closing)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
