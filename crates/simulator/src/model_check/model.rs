//! The world as a stateright [`Model`]: which actions each state allows, and its properties
//! (`properties.rs`).

use stateright::{Model, Property};

use super::properties::{ONCE, SPECS};
use super::state::{Action, CallId, Delivery, Phase, State};
use super::world::{Narration, World};
use super::Expectation;

impl Model for World {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        let deliveries: &[Delivery] = if state.lost < config.lost_answers {
            &Delivery::ALL
        } else {
            &Delivery::ALL[..1]
        };
        for (key, log) in (0..).zip(&state.keys) {
            if log.sends >= config.sends_per_key {
                continue;
            }
            for gateway in 0..config.gateways {
                for args in 0..2 {
                    for &delivery in deliveries {
                        actions.push(Action::Send {
                            gateway,
                            key,
                            args,
                            delivery,
                        });
                    }
                }
            }
        }
        for call in &state.calls {
            let id = call.id;
            match call.phase {
                Phase::TakingOver { .. } => {
                    for &delivery in deliveries {
                        actions.push(Action::TakeOver { call: id, delivery });
                    }
                }
                Phase::Running { run, .. } => {
                    if run.is_none() {
                        actions.push(Action::Execute { call: id });
                    } else {
                        for &delivery in deliveries {
                            actions.push(Action::Complete { call: id, delivery });
                        }
                    }
                    if config.renewals {
                        actions.push(Action::Renew { call: id });
                    }
                }
            }
        }
        for &call in &state.unreleased {
            actions.push(Action::Release { call });
        }
        if state.crashes < config.crashes {
            for gateway in 0..config.gateways {
                let busy = |id: &CallId| id.gateway == gateway;
                if state.calls.iter().any(|call| busy(&call.id))
                    || state.unreleased.iter().any(busy)
                {
                    actions.push(Action::Crash { gateway });
                }
            }
        }
        if state.now < config.ticks {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.apply(state, action, &mut Narration::silent())
    }

    fn properties(&self) -> Vec<Property<Self>> {
        SPECS
            .iter()
            .zip(ONCE)
            .filter(|(spec, _)| (spec.applies)(&self.config))
            .map(|(spec, condition)| match spec.expectation {
                Expectation::Always => Property::always(spec.name, condition),
                Expectation::Sometimes => Property::sometimes(spec.name, condition),
            })
            .collect()
    }
}
