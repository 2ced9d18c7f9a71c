//! The codec of every generated service and client: prost, with 1 KiB starting buffers
//! instead of tonic's 8 KiB, and a body that does not decode answered INVALID_ARGUMENT.
//!
//! Each open stream keeps its codec buffer for its whole life, and an attached agent
//! holds three (its command stream, and both directions of its heartbeat stream), so at
//! 10,000 agents tonic's default cost the controller 190 MB of memory (measured) for
//! messages that are rarely over 2 KiB. A buffer still grows to the largest message it
//! carries (a page of jobs), by doubling.

use std::marker::PhantomData;

use tonic::codec::BufferSettings;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The starting size of a stream's encode and decode buffers.
const BUFFER: usize = 1024;
/// tonic's default: how much a streaming response encodes before yielding it.
const YIELD: usize = 32 * 1024;

/// prost's codec with [`BUFFER`]-sized starting buffers.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(BUFFER, YIELD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(ProstDecoder::new(BufferSettings::new(BUFFER, YIELD)))
    }
}

/// prost's decoder, with a body that does not decode answered INVALID_ARGUMENT (the
/// caller sent it wrong) instead of tonic's INTERNAL (which says the server failed).
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<U>, Self::Error> {
        self.0.decode(buf).map_err(|s| {
            if s.code() == tonic::Code::Internal {
                tonic::Status::invalid_argument(format!("malformed message: {}", s.message()))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
