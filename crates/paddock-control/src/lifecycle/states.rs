//! The sandbox state machine: every change of a stored sandbox's state, with the states it may
//! start from and the state it leads to, in one table. Every state change the control plane makes
//! is one of these, applied with its audit row through `core::audit::record` (or, for the two the
//! store applies inside its quota checks, by the store function named in the table).
//!
//! ```text
//!              warm ──claim──► running ◄──boot── creating ◄── (insert)
//!   creating ──warm──► warm            │  ▲ pause/unpause (the paused flag, running only)
//!   running ──stop──► stopped ──readmit──► creating ──restop──► stopped
//!   warm|creating|running ──park (recovery)──► stopped
//!   warm|creating|running ──kill|expire|fail|lose──► killed|expired|failed (ended: no way out)
//!   stopped ──kill_stopped──► killed
//! ```

use paddock_store::SandboxState;

use crate::core::audit::StateChange;

use SandboxState::{Creating, Expired, Failed, Killed, Running, Stopped, Warm};

/// States a live sandbox can be ended from.
pub(crate) const LIVE: &[SandboxState] = &[Warm, Creating, Running];

/// One allowed change of a sandbox's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// A warm-pool sandbox booted: ready to be claimed.
    Warm,
    /// A warm sandbox claimed by a tenant (applied by `StoreTx::claim_warm_sandbox`, with the quota).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "applied by the store's claim; listed so the table is whole"
        )
    )]
    Claim,
    /// A booted sandbox recorded running (a create, a fork's copy, a resumed stopped sandbox).
    Boot,
    /// A running (or paused) sandbox stopped: its processes end, its files are kept.
    Stop,
    /// A sandbox recovery could not bring back stopped with its files kept.
    Park,
    /// A stopped sandbox admitted to boot again (applied by `Store::resume_stopped_checked`, with
    /// the quota).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "applied by the store's resume; listed so the table is whole"
        )
    )]
    Readmit,
    /// A resume whose boot failed: stopped again, its files kept.
    Restop,
    /// A running sandbox's processes frozen (the paused flag).
    Pause,
    /// A paused sandbox thawed.
    Unpause,
    /// A live sandbox killed on request.
    Kill,
    /// A stopped sandbox killed on request.
    KillStopped,
    /// A live sandbox whose timeout passed.
    Expire,
    /// A live sandbox whose boot failed.
    Fail,
    /// A live sandbox lost (its agent gone, its recording or restart failed, recovery gave up).
    Lose,
}

impl Transition {
    #[cfg(test)]
    pub(crate) const ALL: [Transition; 14] = [
        Transition::Warm,
        Transition::Claim,
        Transition::Boot,
        Transition::Stop,
        Transition::Park,
        Transition::Readmit,
        Transition::Restop,
        Transition::Pause,
        Transition::Unpause,
        Transition::Kill,
        Transition::KillStopped,
        Transition::Expire,
        Transition::Fail,
        Transition::Lose,
    ];

    /// The states it may start from.
    pub(crate) const fn from(self) -> &'static [SandboxState] {
        match self {
            Transition::Warm | Transition::Boot | Transition::Restop => &[Creating],
            Transition::Claim => &[Warm],
            Transition::Stop | Transition::Pause | Transition::Unpause => &[Running],
            Transition::Readmit | Transition::KillStopped => &[Stopped],
            Transition::Park
            | Transition::Kill
            | Transition::Expire
            | Transition::Fail
            | Transition::Lose => LIVE,
        }
    }

    /// The state it leads to.
    pub(crate) const fn to(self) -> SandboxState {
        match self {
            Transition::Warm => Warm,
            Transition::Claim | Transition::Boot | Transition::Pause | Transition::Unpause => Running,
            Transition::Stop | Transition::Park | Transition::Restop => Stopped,
            Transition::Readmit => Creating,
            Transition::Kill | Transition::KillStopped => Killed,
            Transition::Expire => Expired,
            Transition::Fail | Transition::Lose => Failed,
        }
    }

    /// Whether a sandbox in `state` may take it.
    pub(crate) fn allows(self, state: SandboxState) -> bool {
        self.from().contains(&state)
    }

    /// The store change that applies it (see `core::audit::record`).
    pub(crate) const fn change(self) -> StateChange {
        match self {
            Transition::Pause => StateChange::Paused(true),
            Transition::Unpause => StateChange::Paused(false),
            // A stop ends a frozen sandbox's processes too: it is no longer paused.
            Transition::Stop | Transition::Park => StateChange::State {
                from: self.from(),
                to: self.to(),
                unpause: true,
            },
            _ => StateChange::State {
                from: self.from(),
                to: self.to(),
                unpause: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::*;

    fn table() -> String {
        let mut out = String::new();
        for t in Transition::ALL {
            let from: Vec<&str> = t.from().iter().map(|s| s.as_str()).collect();
            let flag = match t.change() {
                StateChange::Paused(true) => " (paused set)",
                StateChange::Paused(false) => " (paused cleared)",
                StateChange::State { unpause: true, .. } => " (paused cleared first)",
                StateChange::State { .. } => "",
            };
            writeln!(
                out,
                "{:<12} {} -> {}{flag}",
                format!("{t:?}"),
                from.join("|"),
                t.to()
            )
            .expect("a String takes every write");
        }
        out
    }

    /// The table itself, as a golden: a change to the state machine shows up here.
    #[test]
    fn the_table() {
        let expected = "\
Warm         creating -> warm
Claim        warm -> running
Boot         creating -> running
Stop         running -> stopped (paused cleared first)
Park         warm|creating|running -> stopped (paused cleared first)
Readmit      stopped -> creating
Restop       creating -> stopped
Pause        running -> running (paused set)
Unpause      running -> running (paused cleared)
Kill         warm|creating|running -> killed
KillStopped  stopped -> killed
Expire       warm|creating|running -> expired
Fail         warm|creating|running -> failed
Lose         warm|creating|running -> failed
";
        assert_eq!(table(), expected, "the state machine changed:\n{}", table());
    }

    #[test]
    fn an_ended_sandbox_can_do_nothing() {
        for state in SandboxState::ALL.into_iter().filter(|s| s.is_ended()) {
            for t in Transition::ALL {
                assert!(!t.allows(state), "{t:?} from ended {state}");
            }
        }
    }

    #[test]
    fn a_stopped_sandbox_can_only_resume_or_be_killed() {
        let allowed: Vec<Transition> = Transition::ALL
            .into_iter()
            .filter(|t| t.allows(Stopped))
            .collect();
        assert_eq!(allowed, [Transition::Readmit, Transition::KillStopped]);
    }

    #[test]
    fn only_a_running_sandbox_pauses_and_pausing_keeps_it_running() {
        for t in [Transition::Pause, Transition::Unpause] {
            assert_eq!(t.from(), &[Running]);
            assert_eq!(t.to(), Running);
        }
        for state in SandboxState::ALL.into_iter().filter(|s| *s != Running) {
            assert!(!Transition::Pause.allows(state) && !Transition::Unpause.allows(state));
        }
    }

    #[test]
    fn every_state_change_moves_and_ends_only_from_live() {
        for t in Transition::ALL {
            assert!(!t.from().is_empty(), "{t:?} starts from nowhere");
            if !matches!(t, Transition::Pause | Transition::Unpause) {
                assert!(!t.allows(t.to()), "{t:?} leads where it starts");
            }
            if t.to().is_ended() {
                assert!(
                    t.from().iter().all(|s| s.is_live() || *s == Stopped),
                    "{t:?} ends a sandbox that is not live or stopped"
                );
            }
        }
        // Warm is entered only by a pool's boot, and left only by a claim or an end.
        for t in Transition::ALL.into_iter().filter(|t| t.to() == Warm) {
            assert_eq!(t, Transition::Warm);
        }
    }

    #[test]
    fn every_ended_state_is_reached_from_every_live_state() {
        for state in SandboxState::ALL.into_iter().filter(|s| s.is_ended()) {
            assert!(
                Transition::ALL
                    .into_iter()
                    .any(|t| t.to() == state && LIVE.iter().all(|s| t.allows(*s))),
                "nothing ends a live sandbox as {state}"
            );
        }
    }

    /// Every state change in the sources goes through the table: the store's state-changing calls
    /// appear only in `core/audit` (which applies a table entry's change).
    #[test]
    fn state_changes_go_through_the_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![root.clone()];
        let mut broken = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(&root)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                if rel.starts_with("core/audit") || rel == "lifecycle/states.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read source");
                for call in [".transition_sandbox(", ".set_sandbox_paused(", "StateChange::"] {
                    if text.contains(call) {
                        broken.push(format!("{rel} calls {call}"));
                    }
                }
            }
        }
        assert!(broken.is_empty(), "state changes outside the table: {broken:#?}");
    }
}
