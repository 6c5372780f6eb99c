"""lsquic, picoquic, msquic and mvfst mappings (written from their sources, unverified) on hand-written stacks.

Each stack is leaf first, with function names taken from the stacks' real
sources and the object a build would map them from (the application binary
for static builds, libmsquic.so for msquic, the system's libcrypto/libc).
The checks: auto-detection picks the stack's file and no other stack file,
and the shipped mappings classify each stack as its code says.
"""

from __future__ import annotations

import pytest

from qprof.attribution.categories import CONNECTION, CRYPTO, PACKET_IO
from qprof.attribution.engine import Classifier
from qprof.attribution.mapping import MappingSet

K = "[kernel.kallsyms]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
LIBEVENT = "/usr/lib/x86_64-linux-gnu/libevent-2.1.so.7.0.1"
LSQUIC_APP = "/opt/lsquic/bin/http_server"          # liblsquic.a + BoringSSL linked in
PICOQUIC_APP = "/opt/picoquic/picoquicdemo"         # picoquic-core + picotls linked in
MSQUIC = "/usr/lib/x86_64-linux-gnu/libmsquic.so.2.5.6"  # quictls linked in
MSQUIC_APP = "/opt/msquic/bin/secnetperf"
MVFST_APP = "/opt/mvfst/bin/hq"                     # mvfst, fizz, folly linked in

Frame = tuple[str, str]

SEND_KERNEL = [(s, K) for s in ("ip_finish_output2", "ip_output", "ip_send_skb", "udp_send_skb", "udp_sendmsg",
                                "____sys_sendmsg", "___sys_sendmsg", "__sys_sendmsg", "__x64_sys_sendmsg",
                                "do_syscall_64", "entry_SYSCALL_64_after_hwframe")]


pytestmark = pytest.mark.usefixtures("user_config")


def at(dso: str, *syms: str) -> list[Frame]:
    return [(s, dso) for s in syms]


def detect(stacks: list[list[Frame]], objects: list[str]) -> tuple[list[str], Classifier]:
    """What the report does per process: detect from mapped objects and sampled symbols, then classify."""
    frames = [f for st in stacks for f in st]
    dsos = sorted(set(objects) | {d for _, d in frames})
    chosen = MappingSet.load().for_process(dsos, sorted({s for s, _ in frames}))
    files = [f for f, _ in chosen]
    return [f.name for f in files], Classifier(files)


def check(stacks: dict[str, tuple[list[Frame], tuple[str, str | None]]], objects: list[str],
          stack: str, also: tuple[str, ...] = ()) -> None:
    names, clf = detect([st for st, _ in stacks.values()], objects)
    stack_files = [n for n in names if n in MappingSet.load().names("stack")]
    assert stack_files == [stack], names
    assert set(also) <= set(names), names
    f = next(f for f in clf.files if f.name == stack)
    assert f.verified is False and f.kind == "stack"
    for label, (frames, want) in stacks.items():
        d = clf.classify(frames)
        assert (d.category, d.subcategory) == want, (label, d.category, d.subcategory, d.rule and d.rule.source)


# ---------------------------------------------------------------- lsquic

LSQ_TICK = at(LSQUIC_APP, "lsquic_engine_process_conns", "prog_process_conns", "read_handler") + \
    at(LIBEVENT, "event_base_loop") + at(LSQUIC_APP, "prog_run", "main")
LSQ_SEND = at(LSQUIC_APP, "send_packets_out", "lsquic_engine_send_unsent_packets") + LSQ_TICK
LSQ_RECV = at(LSQUIC_APP, "process_regular_packet", "process_incoming_packet_fast", "ietf_full_conn_ci_packet_in",
              "process_packet_in", "lsquic_engine_packet_in", "read_handler") + at(LIBEVENT, "event_base_loop")

LSQUIC = {
    "sendmmsg under the bundled ea_packets_out": (
        SEND_KERNEL + at(LIBC, "__libc_sendmmsg") +
        at(LSQUIC_APP, "send_packets_using_sendmmsg", "sport_packets_out", "send_batch") + LSQ_SEND,
        (PACKET_IO, "tx syscall")),
    "the engine's batch send around packets_out": (at(LSQUIC_APP, "send_batch") + LSQ_SEND,
                                                    (PACKET_IO, "tx syscall")),
    "cmsg set-up for ECN/pktinfo": (
        at(LSQUIC_APP, "setup_control_msg", "send_packets_using_sendmmsg", "sport_packets_out", "send_batch")
        + LSQ_SEND, (PACKET_IO, "tx syscall")),
    "recvmmsg reader": (at(LSQUIC_APP, "read_using_recvmmsg", "read_handler") + at(LIBEVENT, "event_base_loop"),
                        (PACKET_IO, "rx syscall")),
    "AES-GCM seal under iquic_esf_encrypt_packet": (
        at(LSQUIC_APP, "aesni_gcm_encrypt", "aead_aes_gcm_seal_scatter_impl", "EVP_AEAD_CTX_seal_scatter",
           "EVP_AEAD_CTX_seal", "iquic_esf_encrypt_packet") + LSQ_SEND, (CRYPTO, "aead")),
    "AES-ECB mask flushed before the batch is sent": (
        at(LSQUIC_APP, "aes_hw_ecb_encrypt", "aes_ecb_cipher", "EVP_EncryptUpdate", "gen_hp_mask_aes",
           "flush_hp_batch", "iquic_esf_flush_encryption", "apply_hp", "send_batch") + LSQ_SEND,
        (CRYPTO, "header protection")),
    "packet header written inside the encrypt call": (at(LSQUIC_APP, "gen_short_pkt_header",
                                                        "ietf_v1_gen_reg_pkt_header", "iquic_esf_encrypt_packet")
                                                     + LSQ_SEND, (CONNECTION, "packets & frames")),
    "strip_hp on receive": (at(LSQUIC_APP, "strip_hp", "iquic_esf_decrypt_packet") + LSQ_RECV,
                            (CRYPTO, "header protection")),
    "AES-GCM open": (at(LSQUIC_APP, "aesni_gcm_decrypt", "EVP_AEAD_CTX_open", "iquic_esf_decrypt_packet")
                     + LSQ_RECV, (CRYPTO, "aead")),
    "TLS handshake through BoringSSL": (
        at(LSQUIC_APP, "ecp_nistz256_point_mul", "bssl::ssl_run_handshake", "SSL_do_handshake",
           "iquic_esfi_handshake", "iquic_esfi_data_in", "chsk_ietf_on_read", "lsquic_stream_dispatch_read_events")
        + LSQ_TICK, (CRYPTO, "handshake")),
    "received-packet history": (at(LSQUIC_APP, "lsquic_rechist_received") + LSQ_RECV,
                                (CONNECTION, "ack processing")),
    "ACK frame handling": (at(LSQUIC_APP, "process_ack_frame", "process_packet_frame", "parse_regular_packet")
                           + LSQ_RECV, (CONNECTION, "ack processing")),
    "cubic on ACK": (at(LSQUIC_APP, "lsquic_cubic_ack", "lsquic_send_ctl_got_ack", "process_ack")
                     + LSQ_RECV, (CONNECTION, "congestion control")),
    "loss detection": (at(LSQUIC_APP, "send_ctl_detect_losses", "lsquic_send_ctl_got_ack", "process_ack")
                       + LSQ_RECV, (CONNECTION, "loss recovery")),
    "stream write copy": (at(LIBC, "__memmove_avx_unaligned_erms") +
                          at(LSQUIC_APP, "stream_write_to_packet_std", "lsquic_stream_write") + LSQ_TICK,
                          (CONNECTION, "streams")),
    "connection hash lookup": (at(LSQUIC_APP, "lsquic_hash_find", "find_conn", "process_packet_in",
                                  "lsquic_engine_packet_in", "read_handler") + at(LIBEVENT, "event_base_loop"),
                               (CONNECTION, "connection lookup")),
    "QPACK encoder": (at(LSQUIC_APP, "lsqpack_enc_encode", "lsquic_qeh_write_headers") + LSQ_TICK,
                      (CONNECTION, "http3")),
    "unnamed static helper falls to its lsquic caller": (at(LSQUIC_APP, "calc_mem_used", "lsquic_conn_get_info")
                                                          + LSQ_TICK, (CONNECTION, "connection")),
}


def test_lsquic_static_build() -> None:
    check(LSQUIC, [LSQUIC_APP, LIBC, LIBEVENT], "lsquic", also=("boringssl", "eventloop", "common"))


def test_lsquic_shared_library_detected_by_object() -> None:
    names, _ = detect([], ["/opt/app/server", "/usr/local/lib/liblsquic.so", LIBC])
    assert "lsquic" in names


# ---------------------------------------------------------------- picoquic

PQ_LOOP = at(PICOQUIC_APP, "picoquic_packet_loop_v3", "picoquic_packet_loop_v2", "main")
PQ_PREPARE = at(PICOQUIC_APP, "picoquic_finalize_and_protect_packet", "picoquic_prepare_packet_ready",
                "picoquic_prepare_segment", "picoquic_prepare_packet_ex", "picoquic_prepare_next_packet_ex") + PQ_LOOP
PQ_INCOMING = at(PICOQUIC_APP, "picoquic_incoming_segment", "picoquic_incoming_packet_ex",
                 "picoquic_packet_loop_udp_received") + PQ_LOOP

PICOQUIC = {
    "sendmsg with GSO": (SEND_KERNEL + at(LIBC, "__libc_sendmsg") +
                         at(PICOQUIC_APP, "picoquic_sendmsg", "picoquic_packet_loop_do_udp_send") + PQ_LOOP,
                         (PACKET_IO, "tx syscall")),
    "picoquic_sendmsg itself": (at(PICOQUIC_APP, "picoquic_sendmsg", "picoquic_packet_loop_do_udp_send") + PQ_LOOP,
                                (PACKET_IO, "tx syscall")),
    "cmsg parsing after recvmsg": (at(PICOQUIC_APP, "picoquic_socks_cmsg_parse", "picoquic_recvmsg",
                                      "picoquic_packet_loop_poll") + PQ_LOOP, (PACKET_IO, "rx syscall")),
    "the socket loop itself": (PQ_LOOP, (PACKET_IO, "socket loop")),
    "AES-GCM through picotls's OpenSSL back-end": (
        at(LIBCRYPTO, "aesni_gcm_encrypt", "ossl_gcm_cipher_update", "EVP_EncryptUpdate") +
        at(PICOQUIC_APP, "aead_do_encrypt_update", "picoquic_aead_encrypt_generic", "picoquic_protect_packet")
        + PQ_PREPARE, (CRYPTO, "aead")),
    "header-protection mask (AES-ECB in libcrypto)": (
        at(LIBCRYPTO, "aesni_ecb_encrypt", "ecb_cipher", "EVP_EncryptUpdate") +
        at(PICOQUIC_APP, "cipher_encrypt", "picoquic_pn_encrypt", "picoquic_protect_packet_header",
           "picoquic_protect_packet") + PQ_PREPARE, (CRYPTO, "header protection")),
    "removing header protection": (at(PICOQUIC_APP, "picoquic_remove_header_protection_inner",
                                      "picoquic_remove_header_protection", "picoquic_parse_header_and_decrypt")
                                   + PQ_INCOMING, (CRYPTO, "header protection")),
    "fusion AES-GCM decrypt": (at(PICOQUIC_APP, "aesgcm_decrypt", "ptls_fusion_aesgcm_decrypt",
                                  "aead_do_decrypt", "picoquic_aead_decrypt_generic",
                                  "picoquic_remove_packet_protection", "picoquic_parse_header_and_decrypt")
                               + PQ_INCOMING, (CRYPTO, "aead")),
    "TLS handshake (ECDHE in libcrypto)": (
        at(LIBCRYPTO, "ecp_nistz256_point_mul", "EVP_PKEY_derive") +
        at(PICOQUIC_APP, "evp_keyex_exchange", "server_handle_hello", "ptls_server_handle_message",
           "ptls_handle_message", "picoquic_tls_stream_process", "picoquic_incoming_client_initial")
        + PQ_INCOMING, (CRYPTO, "handshake")),
    "SACK ranges in a splay tree": (at(PICOQUIC_APP, "picosplay_insert", "picoquic_sack_insert_item",
                                       "picoquic_update_sack_list", "picoquic_record_pn_received",
                                       "picoquic_incoming_1rtt") + PQ_INCOMING, (CONNECTION, "ack processing")),
    "ACK range processing": (at(PICOQUIC_APP, "picoquic_process_ack_range", "picoquic_decode_ack_frame",
                                "picoquic_decode_frames", "picoquic_incoming_1rtt") + PQ_INCOMING,
                             (CONNECTION, "ack processing")),
    "BBR model update": (at(PICOQUIC_APP, "BBRUpdateModelAndState", "BBRUpdateOnACK", "picoquic_bbr_notify",
                            "picoquic_process_ack_of_ack_frame") + PQ_INCOMING, (CONNECTION, "congestion control")),
    "pacing check": (at(PICOQUIC_APP, "picoquic_is_sending_authorized_by_pacing", "picoquic_prepare_packet_ready")
                     + PQ_PREPARE[2:], (CONNECTION, "congestion control")),
    "retransmission scan": (at(PICOQUIC_APP, "picoquic_retransmit_needed_packet", "picoquic_retransmit_needed",
                               "picoquic_prepare_packet_ready") + PQ_PREPARE[2:], (CONNECTION, "loss recovery")),
    "stream frame formatting": (at(LIBC, "__memmove_avx_unaligned_erms") +
                                at(PICOQUIC_APP, "picoquic_format_stream_frame",
                                   "picoquic_format_available_stream_frames", "picoquic_prepare_packet_ready")
                                + PQ_PREPARE[2:], (CONNECTION, "streams")),
    "connection lookup by CID": (at(PICOQUIC_APP, "siphash", "picohash_retrieve", "picoquic_cnx_by_id",
                                    "picoquic_parse_packet_header", "picoquic_incoming_segment",
                                    "picoquic_incoming_packet_ex", "picoquic_packet_loop_udp_received") + PQ_LOOP,
                                 (CONNECTION, "connection lookup")),
    "h3zero server callback": (at(PICOQUIC_APP, "h3zero_server_callback_data", "h3zero_callback",
                                  "picoquic_stream_data_callback", "picoquic_decode_stream_frame")
                               + PQ_INCOMING, (CONNECTION, "http3")),
}


def test_picoquic_static_build() -> None:
    check(PICOQUIC, [PICOQUIC_APP, LIBC, LIBCRYPTO], "picoquic", also=("crypto", "common"))


def test_picoquic_shared_libraries_detected_by_object() -> None:
    names, _ = detect([], ["/opt/app/quicserver", "/usr/local/lib/libpicoquic-core.so", LIBC])
    assert "picoquic" in names


# ---------------------------------------------------------------- msquic

MQ_WORKER = at(MSQUIC, "QuicConnDrainOperations", "QuicWorkerProcessConnection", "QuicWorkerLoop",
               "CxPlatRunExecutionContexts", "CxPlatWorkerThread") + at(LIBC, "start_thread")
MQ_FLUSH = at(MSQUIC, "QuicPacketBuilderFinalize", "QuicSendFlush") + MQ_WORKER
MQ_RECV = at(MSQUIC, "QuicConnRecvDatagramBatch", "QuicConnRecvDatagrams", "QuicConnFlushRecv") + MQ_WORKER
MQ_EVENTS = at(MSQUIC, "CxPlatSocketContextIoEventComplete", "CxPlatProcessEvents", "CxPlatWorkerThread") + \
    at(LIBC, "start_thread")

MSQUIC_STACKS = {
    "segmented send (UDP_SEGMENT)": (
        SEND_KERNEL + at(LIBC, "__libc_sendmsg") +
        at(MSQUIC, "CxPlatSendDataSendSegmented", "CxPlatSendDataSend", "SocketSend", "CxPlatSocketSend",
           "QuicBindingSend", "QuicPacketBuilderSendBatch") + MQ_FLUSH, (PACKET_IO, "tx syscall")),
    "send-data buffers": (at(MSQUIC, "CxPlatSendDataAllocBuffer", "QuicPacketBuilderPrepare",
                             "QuicPacketBuilderPrepareForStreamFrames", "QuicSendFlush") + MQ_WORKER,
                          (PACKET_IO, "tx syscall")),
    "receive completion": (at(MSQUIC, "CxPlatSocketReceiveMessages", "CxPlatSocketReceive",
                              "CxPlatSocketContextRecvComplete") + MQ_EVENTS, (PACKET_IO, "rx syscall")),
    "event dispatch": (at(MSQUIC, "CxPlatProcessEvents", "CxPlatWorkerThread") + at(LIBC, "start_thread"),
                       (PACKET_IO, "poll")),
    "AES-GCM in bundled quictls": (
        at(MSQUIC, "aesni_gcm_encrypt", "generic_aes_gcm_cipher_update", "ossl_gcm_stream_update",
           "EVP_EncryptUpdate", "CxPlatEncrypt") + MQ_FLUSH, (CRYPTO, "aead")),
    "header-protection mask on send": (
        at(MSQUIC, "aesni_ecb_encrypt", "ossl_cipher_generic_block_update", "EVP_EncryptUpdate",
           "CxPlatHpComputeMask", "QuicPacketBuilderFinalizeHeaderProtection") + MQ_FLUSH,
        (CRYPTO, "header protection")),
    "batched header-protection masks on receive": (
        at(MSQUIC, "aesni_ecb_encrypt", "EVP_EncryptUpdate", "CxPlatHpComputeMask") + MQ_RECV,
        (CRYPTO, "header protection")),
    "decryption": (at(MSQUIC, "aesni_gcm_decrypt", "EVP_DecryptUpdate", "CxPlatDecrypt",
                      "QuicConnRecvDecryptAndAuthenticate") + MQ_RECV, (CRYPTO, "aead")),
    "TLS handshake in quictls": (at(MSQUIC, "ecp_nistz256_point_mul", "tls_process_client_hello",
                                    "state_machine", "SSL_do_handshake", "CxPlatTlsProcessData",
                                    "QuicCryptoProcessData") + MQ_WORKER, (CRYPTO, "handshake")),
    "ACK tracking through ranges": (at(MSQUIC, "QuicRangeAddRange", "QuicAckTrackerAddPacketNumber",
                                       "QuicConnRecvPostProcessing") + MQ_RECV, (CONNECTION, "ack processing")),
    "ACK frame processing": (at(MSQUIC, "QuicLossDetectionProcessAckBlocks", "QuicLossDetectionProcessAckFrame",
                                "QuicConnRecvFrames") + MQ_RECV, (CONNECTION, "ack processing")),
    "cubic": (at(MSQUIC, "CubicCongestionControlOnDataAcknowledged", "QuicLossDetectionProcessAckBlocks")
              + MQ_RECV, (CONNECTION, "congestion control")),
    "lost packets": (at(MSQUIC, "QuicLossDetectionDetectAndHandleLostPackets", "QuicLossDetectionProcessTimerOperation",
                        "QuicConnProcessExpiredTimer") + MQ_WORKER, (CONNECTION, "loss recovery")),
    "stream receive copy": (at(LIBC, "__memmove_avx_unaligned_erms") +
                            at(MSQUIC, "QuicRecvBufferCopyIntoChunks", "QuicRecvBufferWrite",
                               "QuicStreamProcessStreamFrame", "QuicStreamRecv", "QuicConnRecvFrames") + MQ_RECV,
                            (CONNECTION, "streams")),
    "CID lookup on the binding": (at(MSQUIC, "CxPlatHashtableLookup", "QuicLookupFindConnectionByLocalCidInternal",
                                     "QuicLookupFindConnectionByLocalCid", "QuicBindingDeliverPackets",
                                     "QuicBindingReceive", "CxPlatSocketContextRecvComplete") + MQ_EVENTS,
                                  (CONNECTION, "connection lookup")),
    "building frames": (at(MSQUIC, "QuicSendWriteFrames", "QuicSendFlush") + MQ_WORKER,
                        (CONNECTION, "packets & frames")),
    "the worker loop": (MQ_WORKER[2:], (CONNECTION, "worker")),
}


def test_msquic_shared_library() -> None:
    check(MSQUIC_STACKS, [MSQUIC_APP, MSQUIC, LIBC], "msquic", also=("common",))


def test_msquic_static_build_detected_by_symbols() -> None:
    stack = [(s, MSQUIC_APP) for s, _ in MQ_RECV if _ == MSQUIC]
    names, clf = detect([stack], [MSQUIC_APP, LIBC])
    assert [n for n in names if n in MappingSet.load().names("stack")] == ["msquic"]
    d = clf.classify(at(MSQUIC_APP, "CxPlatHpComputeMask") + stack)
    assert (d.category, d.subcategory) == (CRYPTO, "header protection")


def test_msquic_bundled_crypto_rule_stays_in_libmsquic() -> None:
    """OpenSSL names in libmsquic.so are Crypto; the same names elsewhere are crypto.toml's business."""
    _, clf = detect([at(MSQUIC, "QuicWorkerLoop")], [MSQUIC, LIBC])
    d = clf.classify(at(MSQUIC, "drbg_ctr_generate", "RAND_bytes_ex", "CxPlatRandom",
                        "QuicConnGenerateNewSourceCid", "QuicConnGenerateNewSourceCids") + MQ_WORKER)
    assert (d.category, d.subcategory) == (CRYPTO, "rng")
    assert clf.classify(at(MSQUIC, "EVP_CIPHER_CTX_ctrl", "QuicWorkerLoop")).category == CRYPTO
    assert clf.classify(at("/opt/other/bin/tool", "EVP_CIPHER_CTX_ctrl", "main")).category != CRYPTO


# ---------------------------------------------------------------- mvfst

MV_EVB = at(MVFST_APP, "folly::EventBase::loopMainSecure", "folly::EventBase::loopMain", "folly::EventBase::loop",
            "quic::samples::EchoServer::start", "main")
MV_WRITE = at(MVFST_APP, "quic::writeConnectionDataToSocket", "(anonymous namespace)::writeQuicDataToSocketImpl",
              "quic::writeQuicDataToSocket", "quic::QuicServerTransport::writeData",
              "quic::QuicTransportBaseLite::writeSocketData",
              "quic::QuicTransportBaseLite::TransportLooper::runLoopCallback",
              "folly::EventBase::runLoopCallbacks") + MV_EVB
MV_SOCKET_READ = at(MVFST_APP, "quic::QuicServerWorker::onSocketReadable",
                    "quic::FollyQuicAsyncUDPSocket::FollyReadCallbackWrapper::onNotifyDataAvailable",
                    "folly::AsyncUDPSocket::handleRead", "folly::AsyncUDPSocket::handlerReady") + MV_EVB
MV_READ = at(MVFST_APP, "quic::QuicReadCodec::parsePacket", "quic::onServerReadDataFromOpen",
             "quic::onServerReadData", "quic::QuicServerTransport::onReadData",
             "quic::QuicTransportBaseLite::onNetworkData", "quic::QuicServerWorker::forwardNetworkData",
             "quic::QuicServerWorker::dispatchPacketData", "quic::QuicServerWorker::handleNetworkData") \
    + MV_SOCKET_READ

MVFST = {
    "GSO write": (SEND_KERNEL + at(LIBC, "__libc_sendmsg") +
                  at(MVFST_APP, "folly::netops::sendmsg", "folly::AsyncUDPSocket::writev",
                     "folly::AsyncUDPSocket::writeGSO", "quic::FollyQuicAsyncUDPSocket::writeGSO",
                     "quic::GSOInplacePacketBatchWriter::write", "quic::IOBufQuicBatch::flushInternal",
                     "quic::IOBufQuicBatch::write") + MV_WRITE, (PACKET_IO, "tx syscall")),
    "batch writer append": (at(MVFST_APP, "quic::GSOInplacePacketBatchWriter::append",
                               "quic::IOBufQuicBatch::write") + MV_WRITE, (PACKET_IO, "tx syscall")),
    "recvmmsg in the server worker": (at(MVFST_APP, "quic::QuicAsyncUDPSocketImpl::recvmmsgNetworkData")
                                      + MV_SOCKET_READ, (PACKET_IO, "rx syscall")),
    "AES-GCM under FizzAead": (
        at(LIBCRYPTO, "aesni_gcm_encrypt", "EVP_EncryptUpdate") +
        at(MVFST_APP, "fizz::openssl::(anonymous namespace)::evpEncrypt",
           "fizz::openssl::OpenSSLEVPCipher::inplaceEncrypt", "quic::FizzAead::inplaceEncrypt",
           "(anonymous namespace)::continuousMemoryBuildScheduleEncrypt") + MV_WRITE, (CRYPTO, "aead")),
    "header-protection mask": (
        at(LIBCRYPTO, "aesni_ecb_encrypt", "EVP_EncryptUpdate") +
        at(MVFST_APP, "quic::FizzOpenSSLAes128PacketNumberCipher::mask", "quic::PacketNumberCipher::cipherHeader",
           "quic::PacketNumberCipher::encryptShortHeader", "quic::encryptPacketHeader",
           "(anonymous namespace)::continuousMemoryBuildScheduleEncrypt") + MV_WRITE,
        (CRYPTO, "header protection")),
    "decryption in the read codec": (
        at(LIBCRYPTO, "aesni_gcm_decrypt", "EVP_DecryptUpdate") +
        at(MVFST_APP, "fizz::openssl::OpenSSLEVPCipher::tryDecrypt", "quic::FizzAead::tryDecrypt",
           "quic::QuicReadCodec::tryParseShortHeaderPacket") + MV_READ, (CRYPTO, "aead")),
    "fizz server handshake": (at(MVFST_APP, "fizz::server::EventHandler<fizz::server::ServerTypes, "
                                            "(fizz::server::StateEnum)1, (fizz::Event)1>::handle",
                                 "fizz::server::ServerStateMachine::processSocketData",
                                 "quic::ServerHandshake::processPendingEvents", "quic::ServerHandshake::doHandshake",
                                 "quic::onServerReadDataFromOpen") + MV_READ[2:], (CRYPTO, "handshake")),
    "ACK frame": (at(MVFST_APP, "quic::processAckFrame") + MV_READ, (CONNECTION, "ack processing")),
    "ACK visitor lambda": (at(MVFST_APP, "quic::commonAckVisitorForAckFrame(quic::AckState&, quic::ReadAckFrame const&)"
                                         "::{lambda(auto:1 const&)#1}::operator()", "quic::processAckFrame")
                           + MV_READ, (CONNECTION, "ack processing")),
    "cubic": (at(MVFST_APP, "quic::Cubic::onPacketAckOrLoss", "quic::updateCongestionControllerForAck",
                 "quic::processAckFrame") + MV_READ, (CONNECTION, "congestion control")),
    "BBR2": (at(MVFST_APP, "quic::Bbr2CongestionController::onPacketAckOrLoss") + MV_READ,
             (CONNECTION, "congestion control")),
    "loss detection": (at(MVFST_APP, "quic::detectLossPackets", "quic::processAckFrame") + MV_READ,
                       (CONNECTION, "loss recovery")),
    "stream data into the read buffer": (at(LIBC, "__memmove_avx_unaligned_erms") +
                                         at(MVFST_APP, "quic::appendDataToReadBufferCommon",
                                            "quic::appendDataToReadBuffer",
                                            "quic::receiveReadStreamFrameSMHandler") + MV_READ,
                                         (CONNECTION, "streams")),
    "flow-control update": (at(MVFST_APP, "quic::maybeSendConnWindowUpdate", "quic::updateFlowControlOnRead")
                            + MV_READ, (CONNECTION, "flow control")),
    "routing to the transport by CID": (at(MVFST_APP, "quic::QuicServerWorker::dispatchPacketData",
                                           "quic::QuicServerWorker::handleNetworkData") + MV_SOCKET_READ,
                                        (CONNECTION, "connection lookup")),
    "packet parsing": (MV_READ, (CONNECTION, "packets & frames")),
    "write-loop lambda": (at(MVFST_APP, "quic::writeConnectionDataToSocket(quic::QuicAsyncUDPSocket&, "
                                        "quic::QuicConnectionStateBase&)::{lambda()#1}::operator()") + MV_WRITE,
                          (CONNECTION, "packets & frames")),
    "event loop": (MV_EVB, (CONNECTION, "event loop")),
}


def test_mvfst_static_build() -> None:
    check(MVFST, [MVFST_APP, LIBC, LIBCRYPTO], "mvfst", also=("crypto", "common"))


def test_google_quiche_namespace_is_not_mvfst() -> None:
    """Google's QUICHE shares the `quic::` namespace: its classes must not load mvfst's file."""
    names, _ = detect([at("/opt/envoy/bin/envoy", "quic::QuicConnection::ProcessUdpPacket",
                          "quic::QuicFramer::ProcessPacket", "quic::QuicDispatcher::ProcessPacket",
                          "quic::QuicServer::WaitForEvents")], ["/opt/envoy/bin/envoy", LIBC])
    assert "mvfst" not in names


# ---------------------------------------------------------------- all four

def test_not_loaded_for_other_stacks() -> None:
    ngtcp2 = ["/usr/lib/x86_64-linux-gnu/libngtcp2.so.16.0.0", LIBC, LIBCRYPTO]
    names, _ = detect([at("/usr/bin/gtlsserver", "main")], ngtcp2)
    assert not {"lsquic", "picoquic", "msquic", "mvfst"} & set(names)


@pytest.mark.parametrize("name", ["lsquic", "picoquic", "msquic", "mvfst"])
def test_unverified_and_no_whole_binary_rule(name: str) -> None:
    f = next(f for f in MappingSet.load().files if f.name == name)
    assert f.kind == "stack" and f.verified is False
    for r in f.rules:
        if r.symbol is None and r.within is None and r.dso is not None:
            # a DSO-wide rule names a library, never an application binary or [unknown]
            assert r.dso.search("/opt/app/bin/server") is None and r.dso.search("[unknown]") is None, r.source
            assert r.dso.pattern.startswith("/lib") or "/lib" in r.dso.pattern, r.source
