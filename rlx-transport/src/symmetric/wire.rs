//! The messages of the heap service and their encoding: pure functions, no I/O.
//!
//! Every message is one transport message on the heap tag, so its length is already bounded
//! by the carrying transport. Layout (all integers little-endian):
//!
//! | kind | message       | fields after `kind: u8, id: u64`                                  |
//! |------|---------------|-------------------------------------------------------------------|
//! | 1    | `Put`         | `offset: u64`, then the data (the rest of the message)            |
//! | 2    | `PutSignal`   | `offset, signal_offset, signal_value: u64, signal_op: u8`, data   |
//! | 3    | `Get`         | `offset: u64, len: u64`                                           |
//! | 4    | `FetchAdd`    | `offset: u64, value: u64`                                         |
//! | 5    | `CompareSwap` | `offset: u64, expected: u64, new: u64`                            |
//! | 0x81 | `Ack`         | nothing                                                           |
//! | 0x82 | `Data`        | the bytes read (the rest of the message)                          |
//! | 0x83 | `Value`       | `value: u64` (the word before an atomic)                          |
//! | 0x84 | `Fault`       | `fault: u8` (1 out of bounds, 2 misaligned), `offset, len, heap_size: u64` |
//!
//! Decoding is strict: an unknown kind, a fixed-size message of the wrong length or an
//! unknown enumeration value is a [`CollectiveError::Protocol`] naming the peer. Decoding never
//! allocates; the length of a get is checked against the heap by the service before anything
//! is allocated for it.

use crate::symmetric::heap::HeapFault;
use crate::{CollectiveError, Result};

/// How a put-with-signal updates the signal word after the data has landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignalOp {
    /// The word becomes the value.
    Set,
    /// The value is added to the word (wrapping), for counting arrivals.
    Add,
}

/// The signal of a put-with-signal: which word of the target's heap, and how it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signal {
    /// Heap offset of the 64-bit signal word (8-byte aligned).
    pub offset: u64,
    /// The value set or added.
    pub value: u64,
    /// Set or add.
    pub op: SignalOp,
}

impl Signal {
    /// A signal that sets the word at `offset` to `value`.
    pub fn set(offset: u64, value: u64) -> Signal {
        Signal {
            offset,
            value,
            op: SignalOp::Set,
        }
    }

    /// A signal that adds `value` to the word at `offset`.
    pub fn add(offset: u64, value: u64) -> Signal {
        Signal {
            offset,
            value,
            op: SignalOp::Add,
        }
    }
}

/// A request from an initiator to the rank whose heap it addresses. `id` is chosen by the
/// initiator and comes back in the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Write `data` at `offset`.
    Put {
        /// Request id.
        id: u64,
        /// Heap offset.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// Write `data` at `offset`, then update the signal word.
    PutSignal {
        /// Request id.
        id: u64,
        /// Heap offset of the data.
        offset: u64,
        /// The signal applied after the data.
        signal: Signal,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// Read `len` bytes at `offset`.
    Get {
        /// Request id.
        id: u64,
        /// Heap offset.
        offset: u64,
        /// Number of bytes.
        len: u64,
    },
    /// Atomically add `value` to the word at `offset`.
    FetchAdd {
        /// Request id.
        id: u64,
        /// Heap offset of the word.
        offset: u64,
        /// The addend.
        value: u64,
    },
    /// Atomically replace the word at `offset` with `new` if it equals `expected`.
    CompareSwap {
        /// Request id.
        id: u64,
        /// Heap offset of the word.
        offset: u64,
        /// The value the word must hold.
        expected: u64,
        /// The value it gets.
        new: u64,
    },
}

/// The answer to one [`Request`], carrying the request's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// A put or put-with-signal has been applied to the heap.
    Ack {
        /// Request id.
        id: u64,
    },
    /// The bytes a get read.
    Data {
        /// Request id.
        id: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// The word's value before an atomic.
    Value {
        /// Request id.
        id: u64,
        /// The previous value.
        value: u64,
    },
    /// The heap refused the request; nothing was changed.
    Fault {
        /// Request id.
        id: u64,
        /// Why.
        fault: HeapFault,
    },
}

impl Response<'_> {
    /// The id of the request this answers.
    pub fn id(&self) -> u64 {
        match *self {
            Response::Ack { id }
            | Response::Data { id, .. }
            | Response::Value { id, .. }
            | Response::Fault { id, .. } => id,
        }
    }
}

/// A decoded heap message: requests and responses share the heap tag of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A request to serve.
    Request(Request<'a>),
    /// A response to one of this rank's requests.
    Response(Response<'a>),
}

const PUT: u8 = 1;
const PUT_SIGNAL: u8 = 2;
const GET: u8 = 3;
const FETCH_ADD: u8 = 4;
const COMPARE_SWAP: u8 = 5;
const ACK: u8 = 0x81;
const DATA: u8 = 0x82;
const VALUE: u8 = 0x83;
const FAULT: u8 = 0x84;

const FAULT_OUT_OF_BOUNDS: u8 = 1;
const FAULT_MISALIGNED: u8 = 2;

/// Bytes before the data of a put.
pub const PUT_HEADER_LEN: usize = 17;
/// Bytes before the data of a put-with-signal.
pub const PUT_SIGNAL_HEADER_LEN: usize = 34;
/// Bytes before the data of a data response.
pub const DATA_HEADER_LEN: usize = 9;
const GET_LEN: usize = 25;
const FETCH_ADD_LEN: usize = 25;
const COMPARE_SWAP_LEN: usize = 33;
const ACK_LEN: usize = 9;
const VALUE_LEN: usize = 17;
const FAULT_LEN: usize = 34;

/// Whether `bytes` is a request (as opposed to a response) by its kind byte alone; lets a
/// link's reader route a message without decoding it. Empty messages count as responses so
/// that decoding reports them.
pub fn is_request(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(PUT..=COMPARE_SWAP))
}

struct Writer<const N: usize> {
    buf: [u8; N],
    at: usize,
}

impl<const N: usize> Writer<N> {
    fn new(kind: u8, id: u64) -> Self {
        let mut w = Writer {
            buf: [0u8; N],
            at: 0,
        };
        w.u8(kind);
        w.u64(id);
        w
    }

    fn u8(&mut self, v: u8) {
        self.buf[self.at] = v;
        self.at += 1;
    }

    fn u64(&mut self, v: u64) {
        self.buf[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
    }

    fn finish(self) -> [u8; N] {
        debug_assert_eq!(
            self.at, N,
            "encoder wrote a different length than its layout"
        );
        self.buf
    }
}

/// The header of a put; send it followed by the data.
pub fn encode_put_header(id: u64, offset: u64) -> [u8; PUT_HEADER_LEN] {
    let mut w = Writer::new(PUT, id);
    w.u64(offset);
    w.finish()
}

/// The header of a put-with-signal; send it followed by the data.
pub fn encode_put_signal_header(
    id: u64,
    offset: u64,
    signal: Signal,
) -> [u8; PUT_SIGNAL_HEADER_LEN] {
    let mut w = Writer::new(PUT_SIGNAL, id);
    w.u64(offset);
    w.u64(signal.offset);
    w.u64(signal.value);
    w.u8(match signal.op {
        SignalOp::Set => 1,
        SignalOp::Add => 2,
    });
    w.finish()
}

/// A get request.
pub fn encode_get(id: u64, offset: u64, len: u64) -> [u8; GET_LEN] {
    let mut w = Writer::new(GET, id);
    w.u64(offset);
    w.u64(len);
    w.finish()
}

/// A fetch-and-add request.
pub fn encode_fetch_add(id: u64, offset: u64, value: u64) -> [u8; FETCH_ADD_LEN] {
    let mut w = Writer::new(FETCH_ADD, id);
    w.u64(offset);
    w.u64(value);
    w.finish()
}

/// A compare-and-swap request.
pub fn encode_compare_swap(
    id: u64,
    offset: u64,
    expected: u64,
    new: u64,
) -> [u8; COMPARE_SWAP_LEN] {
    let mut w = Writer::new(COMPARE_SWAP, id);
    w.u64(offset);
    w.u64(expected);
    w.u64(new);
    w.finish()
}

/// An ack response.
pub fn encode_ack(id: u64) -> [u8; ACK_LEN] {
    Writer::new(ACK, id).finish()
}

/// The header of a data response; the bytes follow it.
pub fn encode_data_header(id: u64) -> [u8; DATA_HEADER_LEN] {
    Writer::new(DATA, id).finish()
}

/// A value response.
pub fn encode_value(id: u64, value: u64) -> [u8; VALUE_LEN] {
    let mut w = Writer::new(VALUE, id);
    w.u64(value);
    w.finish()
}

/// A fault response.
pub fn encode_fault(id: u64, fault: HeapFault) -> [u8; FAULT_LEN] {
    let mut w = Writer::new(FAULT, id);
    let (code, offset, len, heap_size) = match fault {
        HeapFault::OutOfBounds {
            offset,
            len,
            heap_size,
        } => (FAULT_OUT_OF_BOUNDS, offset, len, heap_size),
        HeapFault::Misaligned { offset } => (FAULT_MISALIGNED, offset, 8, 0),
    };
    w.u8(code);
    w.u64(offset);
    w.u64(len);
    w.u64(heap_size);
    w.finish()
}

/// Encodes any message into one buffer (the service and initiator send headers and data as
/// separate parts instead; this is the reference encoding they agree with).
pub fn encode(message: &Message<'_>) -> Vec<u8> {
    match *message {
        Message::Request(Request::Put { id, offset, data }) => {
            [&encode_put_header(id, offset)[..], data].concat()
        }
        Message::Request(Request::PutSignal {
            id,
            offset,
            signal,
            data,
        }) => [&encode_put_signal_header(id, offset, signal)[..], data].concat(),
        Message::Request(Request::Get { id, offset, len }) => encode_get(id, offset, len).to_vec(),
        Message::Request(Request::FetchAdd { id, offset, value }) => {
            encode_fetch_add(id, offset, value).to_vec()
        }
        Message::Request(Request::CompareSwap {
            id,
            offset,
            expected,
            new,
        }) => encode_compare_swap(id, offset, expected, new).to_vec(),
        Message::Response(Response::Ack { id }) => encode_ack(id).to_vec(),
        Message::Response(Response::Data { id, data }) => {
            [&encode_data_header(id)[..], data].concat()
        }
        Message::Response(Response::Value { id, value }) => encode_value(id, value).to_vec(),
        Message::Response(Response::Fault { id, fault }) => encode_fault(id, fault).to_vec(),
    }
}

struct Reader<'a> {
    peer: u32,
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &str) -> CollectiveError {
        CollectiveError::protocol(Some(self.peer), format!("malformed heap message: {what}"))
    }

    fn u8(&mut self) -> Result<u8> {
        let (&first, rest) = self
            .bytes
            .split_first()
            .ok_or_else(|| self.bad("truncated"))?;
        self.bytes = rest;
        Ok(first)
    }

    fn u64(&mut self) -> Result<u64> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<8>()
            .ok_or_else(|| self.bad("truncated"))?;
        self.bytes = rest;
        Ok(u64::from_le_bytes(*head))
    }

    fn rest(self) -> &'a [u8] {
        self.bytes
    }

    fn end(self, kind: &str) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.bad(&format!(
                "{} trailing bytes after a {kind}",
                self.bytes.len()
            )))
        }
    }
}

/// Decodes one heap message received from `peer`.
pub fn decode(peer: u32, bytes: &[u8]) -> Result<Message<'_>> {
    let mut r = Reader { peer, bytes };
    let kind = r.u8()?;
    let id = r.u64()?;
    let message = match kind {
        PUT => {
            let offset = r.u64()?;
            Message::Request(Request::Put {
                id,
                offset,
                data: r.rest(),
            })
        }
        PUT_SIGNAL => {
            let offset = r.u64()?;
            let signal_offset = r.u64()?;
            let value = r.u64()?;
            let op = match r.u8()? {
                1 => SignalOp::Set,
                2 => SignalOp::Add,
                other => return Err(r.bad(&format!("unknown signal op {other}"))),
            };
            Message::Request(Request::PutSignal {
                id,
                offset,
                signal: Signal {
                    offset: signal_offset,
                    value,
                    op,
                },
                data: r.rest(),
            })
        }
        GET => {
            let offset = r.u64()?;
            let len = r.u64()?;
            r.end("get")?;
            Message::Request(Request::Get { id, offset, len })
        }
        FETCH_ADD => {
            let offset = r.u64()?;
            let value = r.u64()?;
            r.end("fetch_add")?;
            Message::Request(Request::FetchAdd { id, offset, value })
        }
        COMPARE_SWAP => {
            let offset = r.u64()?;
            let expected = r.u64()?;
            let new = r.u64()?;
            r.end("compare_swap")?;
            Message::Request(Request::CompareSwap {
                id,
                offset,
                expected,
                new,
            })
        }
        ACK => {
            r.end("ack")?;
            Message::Response(Response::Ack { id })
        }
        DATA => Message::Response(Response::Data { id, data: r.rest() }),
        VALUE => {
            let value = r.u64()?;
            r.end("value")?;
            Message::Response(Response::Value { id, value })
        }
        FAULT => {
            let code = r.u8()?;
            let offset = r.u64()?;
            let len = r.u64()?;
            let heap_size = r.u64()?;
            let fault = match code {
                FAULT_OUT_OF_BOUNDS => HeapFault::OutOfBounds {
                    offset,
                    len,
                    heap_size,
                },
                // The encoder writes a misaligned fault's unused fields as 8 and 0; anything
                // else is not one of our messages.
                FAULT_MISALIGNED if len == 8 && heap_size == 0 => HeapFault::Misaligned { offset },
                FAULT_MISALIGNED => return Err(r.bad("misaligned fault with unused fields set")),
                other => return Err(r.bad(&format!("unknown fault code {other}"))),
            };
            r.end("fault")?;
            Message::Response(Response::Fault { id, fault })
        }
        other => return Err(r.bad(&format!("unknown kind {other:#x}"))),
    };
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn every_message_round_trips() {
        let data = b"payload bytes";
        let signal = Signal::add(64, 3);
        let cases: Vec<(Vec<u8>, Message<'_>)> = vec![
            (
                join(&[&encode_put_header(1, 40), data]),
                Message::Request(Request::Put {
                    id: 1,
                    offset: 40,
                    data,
                }),
            ),
            (
                join(&[&encode_put_signal_header(2, 8, signal), data]),
                Message::Request(Request::PutSignal {
                    id: 2,
                    offset: 8,
                    signal,
                    data,
                }),
            ),
            (
                encode_get(u64::MAX, 5, 1 << 40).to_vec(),
                Message::Request(Request::Get {
                    id: u64::MAX,
                    offset: 5,
                    len: 1 << 40,
                }),
            ),
            (
                encode_fetch_add(4, 16, 9).to_vec(),
                Message::Request(Request::FetchAdd {
                    id: 4,
                    offset: 16,
                    value: 9,
                }),
            ),
            (
                encode_compare_swap(5, 24, 1, 2).to_vec(),
                Message::Request(Request::CompareSwap {
                    id: 5,
                    offset: 24,
                    expected: 1,
                    new: 2,
                }),
            ),
            (
                encode_ack(6).to_vec(),
                Message::Response(Response::Ack { id: 6 }),
            ),
            (
                join(&[&encode_data_header(7), data]),
                Message::Response(Response::Data { id: 7, data }),
            ),
            (
                encode_value(8, 77).to_vec(),
                Message::Response(Response::Value { id: 8, value: 77 }),
            ),
            (
                encode_fault(
                    9,
                    HeapFault::OutOfBounds {
                        offset: 1,
                        len: 2,
                        heap_size: 3,
                    },
                )
                .to_vec(),
                Message::Response(Response::Fault {
                    id: 9,
                    fault: HeapFault::OutOfBounds {
                        offset: 1,
                        len: 2,
                        heap_size: 3,
                    },
                }),
            ),
            (
                encode_fault(10, HeapFault::Misaligned { offset: 3 }).to_vec(),
                Message::Response(Response::Fault {
                    id: 10,
                    fault: HeapFault::Misaligned { offset: 3 },
                }),
            ),
        ];
        for (bytes, expected) in &cases {
            assert_eq!(&decode(0, bytes).unwrap(), expected);
            assert_eq!(&encode(expected), bytes);
            assert_eq!(
                is_request(bytes),
                matches!(expected, Message::Request(_)),
                "{expected:?}"
            );
        }
    }

    #[test]
    fn malformed_messages_are_protocol_errors() {
        let mut bad: Vec<Vec<u8>> = vec![
            vec![],
            vec![GET],
            vec![0x42; 9],
            encode_get(1, 2, 3)[..24].to_vec(),
            [&encode_get(1, 2, 3)[..], &[0]].concat(),
            [&encode_ack(1)[..], &[0]].concat(),
            encode_value(1, 1)[..16].to_vec(),
            encode_put_header(1, 1)[..16].to_vec(),
        ];
        let mut wrong_signal = encode_put_signal_header(1, 0, Signal::set(0, 0)).to_vec();
        wrong_signal[PUT_SIGNAL_HEADER_LEN - 1] = 9;
        bad.push(wrong_signal);
        let mut wrong_fault = encode_fault(1, HeapFault::Misaligned { offset: 1 }).to_vec();
        wrong_fault[9] = 7;
        bad.push(wrong_fault);
        for bytes in &bad {
            let err = decode(3, bytes).unwrap_err();
            assert!(
                matches!(err, CollectiveError::Protocol { peer: Some(3), .. }),
                "{bytes:?} gave {err}"
            );
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever it accepts encodes back to
        /// exactly the same bytes (no two encodings of one message, no ignored bytes).
        #[test]
        fn accepted_bytes_re_encode_identically(
            kind in proptest::sample::select(vec![0u8, 1, 2, 3, 4, 5, 0x81, 0x82, 0x83, 0x84, 0xff]),
            rest in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            fault_or_op in 0u8..4,
        ) {
            let mut bytes = vec![kind];
            bytes.extend_from_slice(&rest);
            // Steer some inputs to valid enumeration values so that those paths are reached.
            if kind == FAULT && bytes.len() > 9 {
                bytes[9] = fault_or_op;
            }
            if kind == PUT_SIGNAL && bytes.len() > 33 {
                bytes[33] = fault_or_op;
            }
            if let Ok(message) = decode(1, &bytes) {
                proptest::prop_assert_eq!(encode(&message), bytes.clone());
                proptest::prop_assert_eq!(is_request(&bytes), matches!(message, Message::Request(_)));
            }
        }
    }
}
