//! Proof of the job secret (`RLX_JOB_SECRET`), shared by every exchange that authenticates a
//! connection: the links' handshake, the rendezvous store and the admission desk.
//!
//! Each of them is a challenge-response in both directions: every side sends a fresh nonce
//! and answers the other side's nonce with an HMAC-SHA256 tag keyed by the secret. The tag
//! covers a label that names the side (so that a tag reflected back at its sender is never
//! valid), the bytes of the exchange that the side vouches for, and the nonce. Which label
//! and which bytes is each exchange's choice; the MAC, its constant-time check and the nonces
//! are here, and nothing here touches a socket.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use rlx_transport::CollectiveError;

/// Size of an HMAC-SHA256 tag.
pub(crate) const MAC_LEN: usize = 32;

/// Size of every nonce of the challenge-responses.
pub(crate) const NONCE_LEN: usize = 16;

/// Random bytes for nonces and process instances, from the operating system's generator.
///
/// Fails closed: without randomness a nonce would be predictable and the secret's
/// challenge-response replayable, so the caller stops instead of falling back to anything
/// weaker.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], CollectiveError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| CollectiveError::Io {
        peer: None,
        source: std::io::Error::other(format!(
            "the operating system's random number generator failed ({e}); handshake nonces \
             cannot be made"
        )),
    })?;
    Ok(out)
}

/// The HMAC-SHA256 state keyed by `secret` after `parts`, one after another.
fn keyed(secret: &[u8], parts: &[&[u8]]) -> Option<Hmac<Sha256>> {
    // HMAC takes keys of any length, so this never fails; a failure would yield no MAC (and
    // no successful verification) rather than a panic.
    let mut m = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    for part in parts {
        m.update(part);
    }
    Some(m)
}

/// The HMAC-SHA256 tag keyed by `secret` over `parts` (a side's label, the bytes it vouches
/// for, the other side's nonce).
pub(crate) fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut out = [0u8; MAC_LEN];
    if let Some(m) = keyed(secret, parts) {
        out.copy_from_slice(&m.finalize().into_bytes());
    }
    out
}

/// Whether `tag` is the [`mac`] of `parts` under `secret`, compared in constant time.
pub(crate) fn verify(secret: &[u8], parts: &[&[u8]], tag: &[u8; MAC_LEN]) -> bool {
    keyed(secret, parts).is_some_and(|m| m.verify_slice(tag).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_bind_the_secret_and_every_part() {
        let tag = mac(b"secret", &[b"label", b"bytes", &[7; NONCE_LEN]]);
        assert!(verify(
            b"secret",
            &[b"label", b"bytes", &[7; NONCE_LEN]],
            &tag
        ));
        assert!(!verify(
            b"other",
            &[b"label", b"bytes", &[7; NONCE_LEN]],
            &tag
        ));
        assert!(!verify(
            b"secret",
            &[b"LABEL", b"bytes", &[7; NONCE_LEN]],
            &tag
        ));
        assert!(!verify(
            b"secret",
            &[b"label", b"bytes", &[8; NONCE_LEN]],
            &tag
        ));
        // The parts are hashed one after another: how they are cut does not matter, which is
        // why every exchange puts its fixed-size label and nonce at fixed places.
        assert!(verify(b"secret", &[b"labelbytes", &[7; NONCE_LEN]], &tag));
        assert_ne!(random_bytes::<16>().unwrap(), random_bytes::<16>().unwrap());
    }
}
