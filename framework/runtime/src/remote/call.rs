//! Calls with a deadline, the paved path's request and reply: every call
//! has one, and its failure says which way it failed. (ractor's `call!`
//! has none; the workspace's clippy configuration refuses it.)
//!
//! ```no_run
//! # use flotilla::ractor::{ActorRef, RpcReplyPort};
//! # enum Msg { Ask(RpcReplyPort<u32>) }
//! # impl flotilla::ractor::Message for Msg {}
//! # async fn ask(actor: ActorRef<Msg>) -> Result<(), flotilla::call::CallError> {
//! use std::time::Duration;
//! let answer = flotilla::call::call(&actor, Msg::Ask, Duration::from_secs(2)).await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};

/// Why a call has no answer. Sorted by what the caller should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No answer within the timeout: the request may or may not have been
    /// handled.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The actor, or the session to its node, is gone: the request was not
    /// handled, or its answer was lost.
    #[error("the actor is gone")]
    Gone,
}

/// Sends the message `msg` builds around a reply port to `actor` and
/// waits for the answer, at most `timeout`.
pub async fn call<M, R>(
    actor: &ActorRef<M>,
    msg: impl FnOnce(RpcReplyPort<R>) -> M,
    timeout: Duration,
) -> Result<R, CallError>
where
    M: Message,
    R: Send + 'static,
{
    match actor.call(msg, Some(timeout)).await {
        Ok(CallResult::Success(answer)) => Ok(answer),
        Ok(CallResult::Timeout) => Err(CallError::Timeout(timeout)),
        Ok(CallResult::SenderError) | Err(_) => Err(CallError::Gone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    /// Answers `Ask(true, _)`, keeps `Ask(false, _)` unanswered.
    struct Oracle;

    enum Ask {
        Ask(bool, RpcReplyPort<u32>),
    }

    impl Message for Ask {}

    impl Actor for Oracle {
        type Msg = Ask;
        type State = Vec<RpcReplyPort<u32>>;
        type Arguments = ();

        async fn pre_start(
            &self,
            _me: ActorRef<Ask>,
            _args: (),
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Vec::new())
        }

        async fn handle(
            &self,
            _me: ActorRef<Ask>,
            Ask::Ask(answer, port): Ask,
            kept: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if answer {
                let _ = port.send(42);
            } else {
                kept.push(port);
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_call_answers_times_out_or_finds_the_actor_gone() {
        let (actor, handle) = Actor::spawn(None, Oracle, ()).await.unwrap();
        let t = Duration::from_millis(200);
        assert_eq!(call(&actor, |p| Ask::Ask(true, p), t).await, Ok(42));
        assert_eq!(
            call(&actor, |p| Ask::Ask(false, p), t).await,
            Err(CallError::Timeout(t))
        );
        actor.stop(None);
        handle.await.unwrap();
        assert_eq!(
            call(&actor, |p| Ask::Ask(true, p), t).await,
            Err(CallError::Gone)
        );
    }
}
