package simulate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v82"

	"github.com/tollgate/tollgate/internal/stripetest"
	"github.com/tollgate/tollgate/simulate"
)

// The same stripe-go calls made to stripe-mock (Stripe's own server,
// answering from Stripe's OpenAPI fixtures) and to the simulator: stripe-mock
// accepts each request (so the simulator is not asked for what Stripe would
// refuse), and every field the simulator answers exists in Stripe's object
// with the same kind of value (so no field is made up or mistyped).
func TestStripeShapesAgainstStripeMock(t *testing.T) {
	mock := stripeClient(stripetest.URL(t), "sk_test_123")
	env := newStripeEnv(t, simulate.StripeConfig{})
	sim := env.sc
	ctx := context.Background()

	type pair struct{ sim, mock []byte }
	both := func(what string, call func(c *stripe.Client, real bool) (*stripe.APIResponse, error)) pair {
		t.Helper()
		var out pair
		for _, c := range []struct {
			name string
			cl   *stripe.Client
			real bool
			dst  *[]byte
		}{{"simulator", sim, true, &out.sim}, {"stripe-mock", mock, false, &out.mock}} {
			resp, err := call(c.cl, c.real)
			if err != nil {
				t.Fatalf("%s on %s: %v", what, c.name, err)
			}
			*c.dst = resp.RawJSON
		}
		compareShapes(t, what, out.sim, out.mock)
		return out
	}

	both("create checkout session", func(c *stripe.Client, _ bool) (*stripe.APIResponse, error) {
		s, err := c.V1CheckoutSessions.Create(ctx, sessionParams("acct_shape", 2500))
		return respOf(s, err)
	})
	var simCustomer, mockCustomer string
	both("create customer", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		cu, err := c.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("shape@example.com")})
		if err == nil && real {
			simCustomer = cu.ID
		} else if err == nil {
			mockCustomer = cu.ID
		}
		return respOf(cu, err)
	})
	var simIntent, simCharge string
	both("create off-session payment intent", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		cus := mockCustomer
		if real {
			cus = simCustomer
		}
		p := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"),
			Customer: stripe.String(cus), PaymentMethod: stripe.String("pm_card_visa"),
			OffSession: stripe.Bool(true), Confirm: stripe.Bool(true)}
		p.AddMetadata("credit_usd", "20.00")
		pi, err := c.V1PaymentIntents.Create(ctx, p)
		if err == nil && real {
			simIntent, simCharge = pi.ID, pi.LatestCharge.ID
		}
		return respOf(pi, err)
	})
	both("retrieve charge", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		id := "ch_shape"
		if real {
			id = simCharge
		}
		ch, err := c.V1Charges.Retrieve(ctx, id, nil)
		return respOf(ch, err)
	})
	both("create refund", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		id := "pi_shape"
		if real {
			id = simIntent
		}
		re, err := c.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String(id), Amount: stripe.Int64(500)})
		return respOf(re, err)
	})

	// A dispute and a webhook event, read back through the API.
	sess, err := sim.V1CheckoutSessions.Create(ctx, sessionParams("acct_shape", 1500))
	if err != nil {
		t.Fatal(err)
	}
	payOnPage(t, sess.URL, "pay", "4000 0000 0000 0259")
	dispute := env.hook.waitEvent(t, "charge.dispute.created", 1)[0]
	var dp struct{ ID string }
	json.Unmarshal(dispute.Data.Raw, &dp)
	both("retrieve dispute", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		id := "dp_shape"
		if real {
			id = dp.ID
		}
		d, err := c.V1Disputes.Retrieve(ctx, id, nil)
		return respOf(d, err)
	})
	both("retrieve paid checkout session", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		id := "cs_test_shape"
		if real {
			id = sess.ID
		}
		s, err := c.V1CheckoutSessions.Retrieve(ctx, id, nil)
		return respOf(s, err)
	})
	both("retrieve event (envelope)", func(c *stripe.Client, real bool) (*stripe.APIResponse, error) {
		id := "evt_shape"
		if real {
			id = dispute.ID
		}
		ev, err := c.V1Events.Retrieve(ctx, id, nil)
		return respOf(ev, err)
	})
}

// respOf is the raw answer behind a stripe-go object (its embedded
// APIResource's LastResponse).
func respOf(v any, err error) (*stripe.APIResponse, error) {
	if err != nil {
		return nil, err
	}
	return reflect.ValueOf(v).Elem().FieldByName("LastResponse").Interface().(*stripe.APIResponse), nil
}

// compareShapes fails for a field the simulator sends that Stripe's object
// lacks, or whose value is of another kind (an id where Stripe has an
// expanded object, or the other way round, is allowed).
func compareShapes(t *testing.T, what string, simRaw, mockRaw []byte) {
	t.Helper()
	var simV, mockV any
	if err := json.Unmarshal(simRaw, &simV); err != nil {
		t.Fatalf("%s: simulator: %v", what, err)
	}
	if err := json.Unmarshal(mockRaw, &mockV); err != nil {
		t.Fatalf("%s: stripe-mock: %v", what, err)
	}
	var problems []string
	var walk func(path string, s, m any)
	walk = func(path string, s, m any) {
		if s == nil || m == nil {
			return
		}
		switch sv := s.(type) {
		case map[string]any:
			mv, ok := m.(map[string]any)
			if !ok {
				if _, isID := m.(string); !isID {
					problems = append(problems, fmt.Sprintf("%s: an object, Stripe's is %T", path, m))
				}
				return
			}
			if strings.HasSuffix(path, ".metadata") || strings.HasSuffix(path, ".object") && path != ".object" {
				return // user keys; an event's data.object is compared by its own call
			}
			for k, v := range sv {
				mvk, present := mv[k]
				if !present {
					problems = append(problems, fmt.Sprintf("%s.%s: not in Stripe's object", path, k))
					continue
				}
				walk(path+"."+k, v, mvk)
			}
		case []any:
			if mv, ok := m.([]any); ok && len(sv) > 0 && len(mv) > 0 {
				walk(path+"[0]", sv[0], mv[0])
			}
		default:
			if _, isMap := m.(map[string]any); isMap {
				if _, isID := s.(string); isID {
					return // an id where Stripe expands
				}
			}
			if fmt.Sprintf("%T", s) != fmt.Sprintf("%T", m) {
				problems = append(problems, fmt.Sprintf("%s: %T, Stripe's is %T", path, s, m))
			}
		}
	}
	walk("", simV, mockV)
	sort.Strings(problems)
	if len(problems) > 0 {
		t.Errorf("%s: the simulator's answer differs from Stripe's shape:\n  %s", what, strings.Join(problems, "\n  "))
	}
}
