//! The client's connection preface (RFC 9113 §3.4): the 24-byte magic
//! `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`, then a SETTINGS frame (a 9-byte header, its payload
//! length in the first 3 bytes, then the payload). hyper reads and checks it; [`Watched`] only
//! counts the bytes read through it, to tell the preface timeout when all of it has arrived.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;

const MAGIC: usize = 24;
const FRAME_HEADER: usize = 9;
/// The bytes of the SETTINGS frame's header that hold its payload length.
const LENGTH: std::ops::Range<usize> = MAGIC..MAGIC + 3;

/// A connection's IO, reporting to its [`Activity`] once the whole preface has been read.
pub(super) struct Watched<IO> {
    io: IO,
    /// None once the preface is in: reads then pass straight through.
    preface: Option<Progress>,
    activity: Arc<Activity>,
}

/// How much of the preface has been read.
#[derive(Debug, Default)]
struct Progress {
    read: usize,
    /// The SETTINGS frame's payload length, as far as it has been read.
    length: usize,
}

impl Progress {
    /// Takes the bytes read next; true once the whole preface has been read.
    fn read(&mut self, bytes: &[u8]) -> bool {
        let from = LENGTH.start.saturating_sub(self.read).min(bytes.len());
        let to = LENGTH.end.saturating_sub(self.read).min(bytes.len());
        for &b in &bytes[from..to] {
            self.length = self.length << 8 | usize::from(b);
        }
        self.read += bytes.len();
        self.read >= MAGIC + FRAME_HEADER + self.length
    }
}

impl<IO> Watched<IO> {
    pub(super) fn new(io: IO, activity: Arc<Activity>) -> Watched<IO> {
        Watched {
            io,
            preface: Some(Progress::default()),
            activity,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(progress) = &mut this.preface
            && progress.read(&buf.filled()[before..])
        {
            this.preface = None;
            this.activity.set_prefaced();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The magic, then a SETTINGS frame with `payload` bytes of payload.
    fn preface(payload: usize) -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let length = u32::try_from(payload).expect("small").to_be_bytes();
        bytes.extend_from_slice(&length[1..]);
        bytes.extend_from_slice(&[4, 0, 0, 0, 0, 0]);
        bytes.resize(bytes.len() + payload, 0);
        bytes
    }

    /// How many bytes of `bytes`, read `chunk` at a time, complete the preface; none: never.
    fn completed_by(bytes: &[u8], chunk: usize) -> Option<usize> {
        let mut progress = Progress::default();
        bytes
            .chunks(chunk)
            .position(|c| progress.read(c))
            .map(|i| (i + 1) * chunk)
    }

    #[test]
    fn the_preface_is_complete_with_the_whole_settings_frame() {
        for payload in [0, 6, 18, 300] {
            let bytes = preface(payload);
            let whole = bytes.len();
            assert_eq!(whole, MAGIC + FRAME_HEADER + payload);
            for chunk in [1, 2, 5, 7, 24, 25, 27, 33, whole] {
                let done = completed_by(&bytes, chunk).expect("completed");
                assert!(
                    done >= whole && done < whole + chunk,
                    "{payload} by {chunk}"
                );
            }
            assert_eq!(completed_by(&bytes[..whole - 1], 1), None, "{payload}");
        }
    }

    #[test]
    fn more_bytes_after_the_preface_in_one_read_complete_it() {
        let mut bytes = preface(12);
        bytes.extend_from_slice(&[0; 100]);
        assert!(Progress::default().read(&bytes));
    }
}
