use super::encode::{LIMIT_FIELDS, distinct};
use super::*;
use crate::limiter::LimitParams;

/// A reply as the script packs it.
#[allow(clippy::cast_precision_loss)]
fn packed(numbers: &[i64]) -> Value {
    Value::BulkString(
        numbers
            .iter()
            .flat_map(|&n| (n as f64).to_le_bytes())
            .collect(),
    )
}

fn hit(key: &str, group: usize) -> Hit {
    Hit {
        key: key.as_bytes().into(),
        limit: LimitParams {
            algorithm: Algorithm::Funnel,
            quota: 3,
            period_nanos: 1_500_000_001,
            burst: 4,
            charge: Charge::Always,
            borrow: true,
            block_nanos: 0,
            global: false,
            calendar: None,
        },
        cost: u64::MAX,
        refund: false,
        group,
        role: Role::Quota,
        hold: None,
    }
}

#[test]
fn keys_and_limits_are_sent_once_and_hits_point_at_them() {
    let mut other = hit("b", 1);
    other.limit.quota = 7;
    other.refund = true;
    other.role = Role::Shadow;
    let hits = [hit("a", 0), other, hit("a", 2)];
    let call = encode(
        &one(&hits, Mode::Request),
        b"p:",
        Unit::Micros,
        (None, 0),
        Via::Script,
    );
    let (keys, args) = call.keys_and_args();
    assert_eq!(keys, ["p:a", "p:b"]);
    let limits = [
        "f",
        "3",
        "1500000001",
        "4",
        "3",
        "0",
        "",
        "f",
        "7",
        "1500000001",
        "4",
        "3",
        "0",
        "",
    ];
    assert_eq!(args[..2], ["", "2"]);
    assert_eq!(args[2..2 + 2 * LIMIT_FIELDS], limits);
    assert_eq!(args[2 + 2 * LIMIT_FIELDS], "1", "one request");
    assert_eq!(args.len(), 4 + 2 * LIMIT_FIELDS, "then one binary argument");
    let q = 9_007_199_254_740_991.0;
    assert_eq!(
        call.requests(),
        [(
            0,
            vec![(1, 1, q, 0, 2), (2, 2, q, 1, 1 + 8), (1, 1, q, 2, 2)]
        )]
    );
}

#[test]
fn many_hits_find_their_keys_and_limits_by_hashing() {
    let hits: Vec<Hit> = (0..40).map(|i| hit(["a", "b", "c"][i % 3], i)).collect();
    let (keys, slots) = distinct(hits.iter().map(|h| &*h.key), hits.len());
    assert_eq!(keys, [b"a".as_slice(), b"b", b"c"]);
    let want: Vec<usize> = (0..40).map(|i| i % 3).collect();
    assert_eq!(slots, want);
}

#[test]
fn nanos_round_periods_up_and_scale_resets() {
    let hits = [hit("a", 0)];
    let call = encode(
        &one(&hits, Mode::Independent),
        b"",
        Unit::Nanos,
        (Some(9), 0),
        Via::Function,
    );
    let (_, args) = call.keys_and_args();
    assert_eq!(args[..4], ["9", "1", "f", "3"]);
    assert_eq!(args[4], "1500001");
    assert_eq!(args[7..9], ["0", ""], "no block, no calendar");
    assert_eq!(args[9], "1");
    assert_eq!(call.requests()[0].0, 1, "independent");
    let o = decode(packed(&[1, 2, 7]), &call).unwrap();
    assert_eq!(o[0].hits[0].reset_nanos, 7_000);
}

#[test]
fn a_batch_sends_keys_and_limits_once_and_each_request_after_the_other() {
    let first = [hit("a", 0), hit("b", 1)];
    let second = [hit("b", 0)];
    let parts = [
        Part {
            hits: &first,
            mode: Mode::Request,
        },
        Part {
            hits: &second,
            mode: Mode::Independent,
        },
    ];
    let call = encode(&parts, b"", Unit::Micros, (None, 0), Via::Script);
    let (keys, args) = call.keys_and_args();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(args[2 + LIMIT_FIELDS], "2");
    let q = 9_007_199_254_740_991.0;
    assert_eq!(
        call.requests(),
        [
            (0, vec![(1, 1, q, 0, 2), (2, 1, q, 1, 2)]),
            (1, vec![(2, 1, q, 0, 2)]),
        ]
    );
    let out = decode(packed(&[0, 5, 6, -1, 9, 1, 2, 3]), &call).unwrap();
    assert_eq!(out.len(), 2);
    assert!(!out[0].admitted && out[1].admitted);
    assert_eq!(out[0].hits[1].reset_nanos, 9);
    assert_eq!(out[1].hits[0].remaining, 2);
    assert!(decode(packed(&[0, 5, 6, -1, 9, 1]), &call).is_err());
}

/// A connection answering from a script, recording the command names it was sent.
struct Mock {
    replies: Vec<&'static [u8]>,
    sent: Vec<String>,
}

impl ConnectionLike for Mock {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        let name = cmd.args_iter().next().map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        });
        self.sent.push(name.unwrap_or_default());
        let reply = if self.replies.is_empty() {
            &b"-ERR no more\r\n"[..]
        } else {
            self.replies.remove(0)
        };
        Box::pin(async move { redis::parse_redis_value(reply) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn one(hits: &[Hit], mode: Mode) -> [Part<'_>; 1] {
    [Part { hits, mode }]
}

fn call_via(via: Via) -> Call {
    let hits = [hit("a", 0)];
    encode(
        &one(&hits, Mode::Request),
        b"p:",
        Unit::Nanos,
        (None, 0),
        via,
    )
}

fn mock(replies: &[&'static [u8]]) -> Mock {
    Mock {
        replies: replies.to_vec(),
        sent: Vec::new(),
    }
}

#[tokio::test]
async fn noscript_is_answered_by_sending_the_source_once() {
    let call = call_via(Via::Script);
    let functions = Functions::new(false);
    let mut conn = mock(&[
        b"-NOSCRIPT No matching script.\r\n",
        b"*1\r\n:1\r\n",
        b"*1\r\n:0\r\n",
    ]);
    let first = invoke(&mut conn, &call, &functions).await.unwrap();
    assert_eq!(first, Value::Array(vec![Value::Int(1)]));
    let second = invoke(&mut conn, &call, &functions).await.unwrap();
    assert_eq!(second, Value::Array(vec![Value::Int(0)]));
    assert_eq!(conn.sent, ["EVALSHA", "EVAL", "EVALSHA"]);
    let mut failing = mock(&[b"-ERR boom\r\n"]);
    assert!(invoke(&mut failing, &call, &functions).await.is_err());
    assert_eq!(failing.sent, ["EVALSHA"], "other errors are not retried");
}

#[tokio::test]
async fn a_missing_function_is_loaded_and_called_again() {
    let functions = Functions::new(true);
    let call = call_via(functions.via());
    let mut conn = mock(&[
        b"-ERR Function not found\r\n",
        b"+sluice_x\r\n",
        b"*1\r\n:1\r\n",
        b"*1\r\n:0\r\n",
    ]);
    let first = invoke(&mut conn, &call, &functions).await.unwrap();
    assert_eq!(first, Value::Array(vec![Value::Int(1)]));
    invoke(&mut conn, &call, &functions).await.unwrap();
    assert_eq!(conn.sent, ["FCALL", "FUNCTION", "FCALL", "FCALL"]);
    assert_eq!(functions.via(), Via::Function);
    // Other errors are the call's answer: not retried, functions kept.
    for reply in [
        &b"-ERR sluice: malformed hit 1\r\n"[..],
        b"-BUSY Redis is busy running a script.\r\n",
        b"-LOADING Redis is loading the dataset in memory\r\n",
    ] {
        let mut failing = mock(&[reply]);
        assert!(invoke(&mut failing, &call, &functions).await.is_err());
        assert_eq!(failing.sent, ["FCALL"]);
        assert_eq!(functions.via(), Via::Function);
    }
}

#[tokio::test]
async fn a_redis_refusing_functions_gets_the_script_from_then_on() {
    let refusals: [&[&'static [u8]]; 4] = [
        // Before Redis 7.0.
        &[b"-ERR unknown command `FCALL`, with args beginning with: \r\n"],
        // An ACL without FCALL.
        &[b"-NOPERM User u has no permissions to run the 'fcall' command\r\n"],
        // An ACL without FUNCTION LOAD.
        &[
            b"-ERR Function not found\r\n",
            b"-NOPERM User u has no permissions to run the 'function|load' command\r\n",
        ],
        // A library the server will not load.
        &[
            b"-ERR Function not found\r\n",
            b"-ERR Error registering functions\r\n",
        ],
    ];
    for replies in refusals {
        let functions = Functions::new(true);
        let call = call_via(functions.via());
        let mut all = replies.to_vec();
        all.extend([&b"-NOSCRIPT No matching script.\r\n"[..], b"*1\r\n:1\r\n"]);
        let mut conn = mock(&all);
        let reply = invoke(&mut conn, &call, &functions).await.unwrap();
        assert_eq!(reply, Value::Array(vec![Value::Int(1)]));
        let mut want = vec!["FCALL"];
        if replies.len() == 2 {
            want.push("FUNCTION");
        }
        want.extend(["EVALSHA", "EVAL"]);
        assert_eq!(conn.sent, want);
        assert_eq!(functions.via(), Via::Script);
        let next = call_via(functions.via());
        let mut conn = mock(&[b"*1\r\n:0\r\n"]);
        invoke(&mut conn, &next, &functions).await.unwrap();
        assert_eq!(conn.sent, ["EVALSHA"]);
    }
}

#[tokio::test]
async fn a_read_only_server_while_loading_is_an_error_not_a_refusal() {
    let functions = Functions::new(true);
    let call = call_via(functions.via());
    let mut conn = mock(&[
        b"-ERR Function not found\r\n",
        b"-READONLY You can't write against a read only replica.\r\n",
    ]);
    assert!(invoke(&mut conn, &call, &functions).await.is_err());
    assert_eq!(conn.sent, ["FCALL", "FUNCTION"]);
    assert_eq!(functions.via(), Via::Function);
}

#[test]
fn the_library_is_the_script_with_every_algorithm_made_once() {
    assert_eq!(SOURCE.matches(SCRIPT_MAKERS).count(), 1);
    let lib = &LIBRARY.source;
    assert!(!lib.contains(SCRIPT_MAKERS));
    assert_eq!(lib.matches(LIBRARY_MAKERS).count(), 1);
    assert!(lib.starts_with(&format!("#!lua name={}\n", LIBRARY.name)));
    assert!(lib.contains(&format!(
        "redis.register_function('{}', function(KEYS, ARGV)",
        LIBRARY.name
    )));
    assert!(lib.contains(MAIN) && lib.contains(LIBRARY_TAIL));
    assert!(LIBRARY.name.starts_with("sluice_") && LIBRARY.name.len() == 23);
    let head = |via| {
        let call = call_via(via);
        let mut args = call.cmd.args_iter().take(2).map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        });
        (args.next().unwrap(), args.next().unwrap())
    };
    assert_eq!(head(Via::Function), ("FCALL".into(), LIBRARY.name.clone()));
    assert_eq!(head(Via::Script), ("EVALSHA".into(), SHA.clone()));
}

#[test]
fn a_repeat_in_the_reply_is_the_admitted_hit_before_it() {
    let hits = [hit("a", 0), hit("a", 1), hit("a", 2), hit("a", 3)];
    let call = encode(
        &one(&hits, Mode::Request),
        b"",
        Unit::Nanos,
        (None, 0),
        Via::Script,
    );
    let o = decode(packed(&[0, 4, 5, -1, 7, -2, -2]), &call).unwrap();
    let admitted = HitOutcome {
        admitted: true,
        remaining: 4,
        reset_nanos: 5_000,
        from_local_cache: false,
    };
    let denied = HitOutcome {
        admitted: false,
        remaining: 0,
        reset_nanos: 7_000,
        from_local_cache: false,
    };
    assert_eq!(o[0].hits, [admitted, denied, admitted, admitted]);
}

#[test]
fn decode_checks_the_shape() {
    let hits = [hit("a", 0)];
    let call = encode(
        &one(&hits, Mode::Request),
        b"",
        Unit::Micros,
        (None, 0),
        Via::Script,
    );
    let o = decode(packed(&[1, 2, 3]), &call).unwrap();
    assert!(o[0].admitted);
    assert_eq!(
        o[0].hits[0],
        HitOutcome {
            admitted: true,
            remaining: 2,
            reset_nanos: 3,
            from_local_cache: false,
        }
    );
    assert!(decode(packed(&[1]), &call).is_err(), "short");
    assert!(decode(packed(&[1, 2, 3, 4]), &call).is_err(), "long");
    assert!(decode(Value::Nil, &call).is_err());
    assert!(
        decode(packed(&[1, -3, 3]), &call).is_err(),
        "negative remaining"
    );
    assert!(
        decode(packed(&[1, -1, -3]), &call).is_err(),
        "negative wait"
    );
    assert!(
        decode(packed(&[1, -2]), &call).is_err(),
        "a repeat of nothing"
    );
    assert!(decode(packed(&[]), &call).is_err());
    let array = Value::Array([1, 2, 3].map(Value::Int).to_vec());
    assert!(decode(array, &call).is_err(), "an array");
    let mut ragged = packed(&[1, 2, 3]);
    if let Value::BulkString(bytes) = &mut ragged {
        bytes.pop();
    }
    assert!(decode(ragged, &call).is_err(), "a partial number");
    let mut fraction = 1.5f64.to_le_bytes().to_vec();
    fraction.extend(2f64.to_le_bytes());
    fraction.extend(3f64.to_le_bytes());
    assert!(
        decode(Value::BulkString(fraction), &call).is_err(),
        "not an integer"
    );
}
