/*
 * spanprof_context._native: publishes the current thread's trace context and the process
 * context in the OpenTelemetry formats that out-of-process profilers read without walking the
 * interpreter:
 *
 * - OTEP 4947 thread context: the exported ELF TLS symbol `otel_thread_ctx_v1`, an 8-byte
 *   pointer to the thread's Thread-Local Context Record (NULL: no context);
 * - OTEP 4719 process context: a one-page mapping named OTEL_CTX whose 32-byte header points to
 *   a protobuf-encoded ProcessContext (encoded by the Python side).
 *
 * Every function is called with the GIL held and never releases it, so the Python-level calls
 * of one process are serialized; the per-thread record is only written by its own thread (or,
 * in clear_all_threads(), by a thread holding the GIL while its owner cannot run our code).
 * Build with -mtls-dialect=gnu2 so the symbol is reached through TLSDESC, the access model the
 * OTEP recommends.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#endif
#ifndef PR_SET_VMA_ANON_NAME
#define PR_SET_VMA_ANON_NAME 0
#endif
#ifndef MADV_DONTFORK
#define MADV_DONTFORK 10
#endif

/* ------------------------------------------------------------------------------------------ */
/* OTEP 4947 thread context                                                                    */

#define RECORD_MAX 640 /* the eBPF profiler's custom-labels limit, recommended by the OTEP */
#define RECORD_HEADER 28
#define ATTRS_MAX (RECORD_MAX - RECORD_HEADER)
#define VALUE_MAX 255 /* an entry's length is a u8 */

/* Attribute key indexes, the order of `threadlocal.attribute_key_map` in the process context. */
#define KEY_OSP_BASE_ID 0
#define KEY_OSP_TRACE_ID 1
#define KEY_OSP_PARENT_ID 2
/*
 * The address (16 hex digits) of the Python context (`PyThreadState.context`) current when the
 * OpenTelemetry half was published: a reader that sees the thread in another context (an
 * asyncio task switch, Context.run) knows the published span is not the current one.
 */
#define KEY_PY_CONTEXT 3
#define PY_CONTEXT_LEN 16

/* The Thread-Local Context Record, byte-packed exactly as OTEP 4947 lays it out. */
struct otel_thread_ctx_record {
    uint8_t trace_id[16];     /* W3C byte order (big-endian as an integer) */
    uint8_t span_id[8];       /* W3C byte order */
    uint8_t valid;            /* exactly 1: valid */
    uint8_t trace_flags;      /* W3C trace-flags */
    uint16_t attrs_data_size; /* host order */
    uint8_t attrs_data[ATTRS_MAX]; /* [key_idx:u8][len:u8][value: len bytes] ... */
} __attribute__((packed, aligned(8)));

_Static_assert(offsetof(struct otel_thread_ctx_record, span_id) == 16, "span_id at 16");
_Static_assert(offsetof(struct otel_thread_ctx_record, valid) == 24, "valid at 24");
_Static_assert(offsetof(struct otel_thread_ctx_record, trace_flags) == 25, "trace_flags at 25");
_Static_assert(offsetof(struct otel_thread_ctx_record, attrs_data_size) == 26, "size at 26");
_Static_assert(offsetof(struct otel_thread_ctx_record, attrs_data) == RECORD_HEADER, "attrs at 28");
_Static_assert(sizeof(struct otel_thread_ctx_record) == RECORD_MAX, "640-byte record");

/*
 * The symbol readers look for: exported (default visibility, so it lands in .dynsym), STT_TLS,
 * 8 bytes. Points at the thread's record while the thread has a context, NULL otherwise.
 */
__attribute__((visibility("default"))) __thread struct otel_thread_ctx_record *otel_thread_ctx_v1;
_Static_assert(sizeof(otel_thread_ctx_v1) == 8, "8-byte TLS pointer");

/*
 * What a thread publishes: the record (in place, the pointer stays on it while published) and
 * which halves are set: the OpenTelemetry ids (record header) and the OSProfiler ids (attrs).
 * Each half is rewritten without touching the other. The registry links let uninstall() clear
 * every thread's record, and let a thread's exit unlink it.
 */
/* The OSProfiler half, encoded as attrs entries. */
struct osp_attrs {
    uint16_t size;
    uint8_t data[ATTRS_MAX];
};

struct thread_state {
    struct otel_thread_ctx_record record;
    struct osp_attrs osp;  /* the OSProfiler entries of the attrs */
    uint64_t py_context;   /* PyThreadState.context when the OpenTelemetry half was written */
    uint8_t has_otel;
    uint8_t has_osp;
    uint8_t registered;
    struct otel_thread_ctx_record **slot; /* &otel_thread_ctx_v1 of the owning thread */
    struct thread_state *prev, *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_state *registry;
static pthread_key_t exit_key;
static int exit_key_ready;

static void register_thread(struct thread_state *s);

#ifdef SPANPROF_CONTEXT_RECORD_IN_TLS
/*
 * The record in the module's TLS block. The block is then ~700 bytes, more than glibc's
 * optional static TLS for dlopen'd modules (rtld.optional_static_tls, 512 by default), so the
 * module gets dynamic TLS (readers go through the DTV). For testing readers only.
 */
static __thread struct thread_state tstate_storage;

static inline struct thread_state *get_state(void) { return &tstate_storage; }
static inline struct thread_state *peek_state(void) { return &tstate_storage; }
#define free_state(s) ((void)(s))
#else
/*
 * The record on the heap, allocated on the thread's first publication and freed at its exit:
 * the module's TLS block is two pointers, which glibc places in static TLS (a fixed offset from
 * the thread pointer) unless the surplus is used up, the simplest case for readers.
 */
static __thread struct thread_state *tstate_ptr;

static struct thread_state *get_state(void)
{
    struct thread_state *s = tstate_ptr;
    if (__builtin_expect(s != NULL, 1))
        return s;
    s = calloc(1, sizeof(*s));
    if (!s) {
        PyErr_NoMemory();
        return NULL;
    }
    tstate_ptr = s;
    register_thread(s);
    return s;
}
static inline struct thread_state *peek_state(void) { return tstate_ptr; }
#define free_state(s) (tstate_ptr = NULL, free(s))
#endif

static inline void compiler_fence(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

static inline void store_valid(struct thread_state *s, uint8_t v)
{
    *(volatile uint8_t *)&s->record.valid = v;
}

static inline void store_pointer(struct otel_thread_ctx_record *r)
{
    *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = r;
}

/* Runs in the exiting thread, before its TLS goes away. */
static void on_thread_exit(void *arg)
{
    struct thread_state *s = arg;
    store_pointer(NULL);
    pthread_mutex_lock(&registry_lock);
    if (s->registered) {
        if (s->prev)
            s->prev->next = s->next;
        else
            registry = s->next;
        if (s->next)
            s->next->prev = s->prev;
        s->prev = s->next = NULL;
        s->registered = 0;
    }
    pthread_mutex_unlock(&registry_lock);
    free_state(s);
}

static void register_thread(struct thread_state *s)
{
    if (s->registered)
        return;
    s->slot = &otel_thread_ctx_v1;
    pthread_mutex_lock(&registry_lock);
    s->prev = NULL;
    s->next = registry;
    if (registry)
        registry->prev = s;
    registry = s;
    s->registered = 1;
    pthread_mutex_unlock(&registry_lock);
    if (exit_key_ready)
        pthread_setspecific(exit_key, s);
}

/* Before changing a published record in place: mark it invalid. */
static inline void begin_update(struct thread_state *s)
{
    if (otel_thread_ctx_v1 != NULL) {
        store_valid(s, 0);
        compiler_fence();
    }
}

/* After the fields are written: valid again, or unpublished when both halves are empty. */
static inline void end_update(struct thread_state *s)
{
    if (!s->has_otel && !s->has_osp) {
        if (otel_thread_ctx_v1 != NULL) {
            store_pointer(NULL);
            compiler_fence();
        }
        return;
    }
    compiler_fence();
    store_valid(s, 1);
    compiler_fence();
    if (otel_thread_ctx_v1 == NULL) {
        register_thread(s);
        store_pointer(&s->record);
    }
}

/* An int (any size as Python holds it) into n big-endian bytes; -1 with an exception set. */
static int int_to_be(PyObject *v, uint8_t *out, size_t n)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(v)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(v, out, (Py_ssize_t)n,
                                           Py_ASNATIVEBYTES_BIG_ENDIAN |
                                               Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
                                               Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (need < 0) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* as _PyLong_AsByteArray says it */
            PyErr_Clear();
            PyErr_SetString(PyExc_OverflowError, "can't convert negative int to unsigned");
        }
        return -1;
    }
    if ((size_t)need > n) {
        PyErr_Format(PyExc_OverflowError, "id does not fit in %zu bytes", n);
        return -1;
    }
    return 0;
#else
    return _PyLong_AsByteArray((PyLongObject *)v, out, n, 0, 0);
#endif
}

static inline int all_zero(const uint8_t *b, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= b[i];
    return acc == 0;
}

/* The OpenTelemetry half, converted but not yet published. */
struct otel_ids {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t flags;
    uint8_t set; /* 0: clear the half (zero ids) */
};

static int parse_otel(PyObject *trace_id, PyObject *span_id, PyObject *flags, struct otel_ids *o)
{
    if (int_to_be(trace_id, o->trace_id, 16) || int_to_be(span_id, o->span_id, 8))
        return -1;
    long f = PyLong_AsLong(flags);
    if (f == -1 && PyErr_Occurred())
        return -1;
    if (f < 0 || f > 255) {
        PyErr_SetString(PyExc_ValueError, "trace_flags must be 0..255");
        return -1;
    }
    o->flags = (uint8_t)f;
    /* The OTEP: if either id is set, both must be; an invalid span publishes no ids. */
    o->set = !all_zero(o->trace_id, 16) && !all_zero(o->span_id, 8);
    return 0;
}

/* The record's attrs: the OSProfiler entries, then the Python context of the OpenTelemetry half. */
static void compose_attrs(struct thread_state *s)
{
    static const char digits[] = "0123456789abcdef";
    uint16_t size = s->osp.size;
    memcpy(s->record.attrs_data, s->osp.data, size);
    if (s->has_otel && (size_t)size + 2 + PY_CONTEXT_LEN <= ATTRS_MAX) {
        uint8_t *e = s->record.attrs_data + size;
        e[0] = KEY_PY_CONTEXT;
        e[1] = PY_CONTEXT_LEN;
        for (int i = 0; i < PY_CONTEXT_LEN; i++)
            e[2 + i] = (uint8_t)digits[(s->py_context >> (60 - 4 * i)) & 0xf];
        size += 2 + PY_CONTEXT_LEN;
    }
    s->record.attrs_data_size = size;
}

/* The thread's current Python context (contextvars), as an address. */
static inline uint64_t current_py_context(void)
{
    return (uint64_t)(uintptr_t)PyThreadState_Get()->context;
}

static inline void write_otel(struct thread_state *s, const struct otel_ids *o)
{
    if (o->set) {
        memcpy(s->record.trace_id, o->trace_id, 16);
        memcpy(s->record.span_id, o->span_id, 8);
        s->record.trace_flags = o->flags;
    } else {
        memset(s->record.trace_id, 0, 16 + 8);
        s->record.trace_flags = 0;
    }
    s->has_otel = o->set;
    s->py_context = o->set ? current_py_context() : 0;
    compose_attrs(s);
}


/* Appends [key][len][value] for a str/bytes value (None: nothing); -1 with an exception set. */
static int add_attr(struct osp_attrs *a, uint8_t key, PyObject *v)
{
    const char *p;
    Py_ssize_t n;
    if (v == Py_None)
        return 0;
    if (PyUnicode_Check(v)) {
        p = PyUnicode_AsUTF8AndSize(v, &n); /* cached in the str: no allocation after once */
        if (!p)
            return -1;
    } else if (PyBytes_Check(v)) {
        p = PyBytes_AS_STRING(v);
        n = PyBytes_GET_SIZE(v);
    } else {
        PyErr_Format(PyExc_TypeError, "expected str, bytes or None, got %.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (n == 0)
        return 0;
    if (n > VALUE_MAX)
        n = VALUE_MAX; /* as the OTEP's length byte allows; UUIDs are 36 */
    if ((size_t)a->size + 2 + (size_t)n > ATTRS_MAX)
        return 0; /* does not fit in the 640-byte record: dropped */
    a->data[a->size] = key;
    a->data[a->size + 1] = (uint8_t)n;
    memcpy(a->data + a->size + 2, p, (size_t)n);
    a->size += (uint16_t)(2 + n);
    return 0;
}

static int parse_osp(PyObject *base, PyObject *point, PyObject *parent, struct osp_attrs *a)
{
    a->size = 0;
    if (add_attr(a, KEY_OSP_BASE_ID, base) || add_attr(a, KEY_OSP_TRACE_ID, point) ||
        add_attr(a, KEY_OSP_PARENT_ID, parent))
        return -1;
    return 0;
}

static inline void write_osp(struct thread_state *s, const struct osp_attrs *a)
{
    memcpy(s->osp.data, a->data, a->size);
    s->osp.size = a->size;
    s->has_osp = a->size != 0;
    compose_attrs(s);
}

static PyObject *native_set(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct otel_ids o;
    struct thread_state *s;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set(trace_id, span_id, trace_flags)");
        return NULL;
    }
    if (parse_otel(args[0], args[1], args[2], &o) || !(s = get_state()))
        return NULL;
    begin_update(s);
    write_otel(s, &o);
    end_update(s);
    Py_RETURN_NONE;
}

static PyObject *native_set_osprofiler(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct osp_attrs a;
    struct thread_state *s;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_osprofiler(base_id, trace_id, parent_id)");
        return NULL;
    }
    if (parse_osp(args[0], args[1], args[2], &a))
        return NULL;
    if (a.size == 0 && !((s = peek_state()) && s->has_osp))
        Py_RETURN_NONE; /* nothing published, nothing to publish */
    if (!(s = get_state()))
        return NULL;
    begin_update(s);
    write_osp(s, &a);
    end_update(s);
    Py_RETURN_NONE;
}

static PyObject *native_set_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct otel_ids o;
    struct osp_attrs a;
    struct thread_state *s;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "set_all(trace_id, span_id, trace_flags, base_id, "
                                         "osprofiler_trace_id, parent_id)");
        return NULL;
    }
    if (parse_otel(args[0], args[1], args[2], &o) || parse_osp(args[3], args[4], args[5], &a) ||
        !(s = get_state()))
        return NULL;
    begin_update(s);
    write_otel(s, &o);
    write_osp(s, &a);
    end_update(s);
    Py_RETURN_NONE;
}

static PyObject *str_get_span_context;

/*
 * publish_span(span): the OpenTelemetry half from a span object (anything with
 * get_span_context(); None or anything else clears the half). SpanContext is a tuple
 * (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid); a non-tuple span context
 * is read through its attributes.
 */
static PyObject *native_publish_span(PyObject *self, PyObject *span)
{
    struct otel_ids o;
    struct thread_state *s;
    PyObject *sc = NULL;
    o.set = 0;
    if (span != Py_None) {
#if PY_VERSION_HEX >= 0x03090000
        sc = PyObject_CallMethodNoArgs(span, str_get_span_context);
#else
        sc = PyObject_CallMethodObjArgs(span, str_get_span_context, NULL);
#endif
        if (!sc) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return NULL;
            PyErr_Clear(); /* not a Span: no current span, as get_current_span() says */
        }
    }
    if (sc) {
        int ok;
        if (PyTuple_Check(sc) && PyTuple_GET_SIZE(sc) >= 6) {
            ok = PyObject_IsTrue(PyTuple_GET_ITEM(sc, 5));
            if (ok > 0)
                ok = parse_otel(PyTuple_GET_ITEM(sc, 0), PyTuple_GET_ITEM(sc, 1),
                                PyTuple_GET_ITEM(sc, 3), &o)
                         ? -1
                         : 1;
        } else {
            PyObject *valid = PyObject_GetAttrString(sc, "is_valid");
            ok = valid ? PyObject_IsTrue(valid) : -1;
            Py_XDECREF(valid);
            if (ok > 0) {
                PyObject *t = PyObject_GetAttrString(sc, "trace_id");
                PyObject *p = PyObject_GetAttrString(sc, "span_id");
                PyObject *f = PyObject_GetAttrString(sc, "trace_flags");
                ok = (t && p && f && !parse_otel(t, p, f, &o)) ? 1 : -1;
                Py_XDECREF(t);
                Py_XDECREF(p);
                Py_XDECREF(f);
            }
        }
        Py_DECREF(sc);
        if (ok < 0)
            return NULL;
        if (ok == 0)
            o.set = 0;
    }
    s = peek_state();
    if (!o.set && !(s && s->has_otel))
        Py_RETURN_NONE; /* nothing published, nothing to publish */
    if (!s && !(s = get_state()))
        return NULL;
    if (o.set && s->has_otel && otel_thread_ctx_v1 != NULL &&
        memcmp(s->record.span_id, o.span_id, 8) == 0 &&
        memcmp(s->record.trace_id, o.trace_id, 16) == 0 && s->record.trace_flags == o.flags &&
        s->py_context == current_py_context())
        Py_RETURN_NONE; /* unchanged */
    begin_update(s);
    write_otel(s, &o);
    end_update(s);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* OpenTelemetry runtime-context hooks: attach/detach wrappers in C (no Python frame).         */

static PyObject *native_clear_otel(PyObject *self, PyObject *unused);

#if PY_VERSION_HEX < 0x03090000
#define PyObject_Vectorcall _PyObject_Vectorcall
#endif

typedef struct {
    PyObject_HEAD
    PyObject *inner_attach;      /* the wrapped runtime context's bound methods */
    PyObject *inner_detach;
    PyObject *inner_get_current;
    PyObject *span_key;          /* opentelemetry.trace.propagation._SPAN_KEY */
} HooksObject;

static void hooks_dealloc(HooksObject *h)
{
    Py_XDECREF(h->inner_attach);
    Py_XDECREF(h->inner_detach);
    Py_XDECREF(h->inner_get_current);
    Py_XDECREF(h->span_key);
    PyObject_Free(h);
}

static PyTypeObject HooksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "spanprof_context._native._Hooks",
    .tp_basicsize = sizeof(HooksObject),
    .tp_dealloc = (destructor)hooks_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "State of the attach/detach hooks.",
};

/*
 * Publishes the span of a context (a Context, i.e. a dict subclass; anything else: its .get()).
 * Never fails: publishing must not break the application, so an error clears the OTel half.
 */
static void publish_context_span(HooksObject *h, PyObject *ctx)
{
    PyObject *span, *r;
    if (PyDict_Check(ctx)) {
        span = PyDict_GetItemWithError(ctx, h->span_key); /* borrowed */
        if (span)
            Py_INCREF(span);
    } else {
        span = PyObject_CallMethod(ctx, "get", "O", h->span_key);
    }
    if (!span && PyErr_Occurred())
        PyErr_Clear();
    r = native_publish_span(NULL, span ? span : Py_None);
    Py_XDECREF(span);
    if (r) {
        Py_DECREF(r);
    } else {
        PyErr_Clear();
        native_clear_otel(NULL, NULL);
    }
}

/* attach(context): the wrapped attach, then publish the span of the context made current. */
static PyObject *hook_attach(PyObject *self, PyObject *ctx)
{
    HooksObject *h = (HooksObject *)self;
    PyObject *token = PyObject_Vectorcall(h->inner_attach, &ctx, 1, NULL);
    if (!token)
        return NULL;
    publish_context_span(h, ctx);
    return token;
}

/* detach(token): the wrapped detach, then publish the span of the context now current. */
static PyObject *hook_detach(PyObject *self, PyObject *token)
{
    HooksObject *h = (HooksObject *)self;
    PyObject *type, *value, *tb, *cur;
    PyObject *r = PyObject_Vectorcall(h->inner_detach, &token, 1, NULL);
    PyErr_Fetch(&type, &value, &tb); /* publish even when detach failed */
    cur = PyObject_Vectorcall(h->inner_get_current, NULL, 0, NULL);
    if (cur) {
        publish_context_span(h, cur);
        Py_DECREF(cur);
    } else {
        PyErr_Clear();
        native_clear_otel(NULL, NULL);
    }
    PyErr_Restore(type, value, tb);
    return r;
}

static PyMethodDef hook_attach_def = {"attach", hook_attach, METH_O,
                                      "attach(context): publishing wrapper of attach()."};
static PyMethodDef hook_detach_def = {"detach", hook_detach, METH_O,
                                      "detach(token): publishing wrapper of detach()."};

/* make_hooks(inner_attach, inner_detach, inner_get_current, span_key) -> (attach, detach) */
static PyObject *native_make_hooks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    HooksObject *h;
    PyObject *attach, *detach;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "make_hooks(inner_attach, inner_detach, inner_get_current, span_key)");
        return NULL;
    }
    h = PyObject_New(HooksObject, &HooksType);
    if (!h)
        return NULL;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_INCREF(args[3]);
    h->inner_attach = args[0];
    h->inner_detach = args[1];
    h->inner_get_current = args[2];
    h->span_key = args[3];
    attach = PyCFunction_NewEx(&hook_attach_def, (PyObject *)h, NULL);
    detach = attach ? PyCFunction_NewEx(&hook_detach_def, (PyObject *)h, NULL) : NULL;
    Py_DECREF(h);
    if (!detach) {
        Py_XDECREF(attach);
        return NULL;
    }
    return Py_BuildValue("(NN)", attach, detach);
}

static void clear_state(struct thread_state *s)
{
    s->has_otel = 0;
    s->has_osp = 0;
    store_valid(s, 0);
    compiler_fence();
    memset(s->record.trace_id, 0, 16 + 8);
    s->record.trace_flags = 0;
    s->record.attrs_data_size = 0;
    s->osp.size = 0;
    s->py_context = 0;
}

static PyObject *native_clear(PyObject *self, PyObject *unused)
{
    struct thread_state *s = peek_state();
    if (otel_thread_ctx_v1 != NULL) {
        store_pointer(NULL);
        compiler_fence();
    }
    if (s)
        clear_state(s);
    Py_RETURN_NONE;
}

static PyObject *native_clear_otel(PyObject *self, PyObject *unused)
{
    struct otel_ids o;
    struct thread_state *s = peek_state();
    if (!s || !s->has_otel)
        Py_RETURN_NONE;
    o.set = 0;
    begin_update(s);
    write_otel(s, &o);
    end_update(s);
    Py_RETURN_NONE;
}

static PyObject *native_clear_osprofiler(PyObject *self, PyObject *unused)
{
    struct osp_attrs a;
    struct thread_state *s = peek_state();
    if (!s || !s->has_osp)
        Py_RETURN_NONE;
    a.size = 0;
    begin_update(s);
    write_osp(s, &a);
    end_update(s);
    Py_RETURN_NONE;
}

/* Unpublishes every thread's record (uninstall): pointer NULL, state cleared. */
static PyObject *native_clear_all_threads(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&registry_lock);
    for (struct thread_state *s = registry; s; s = s->next) {
        *(struct otel_thread_ctx_record *volatile *)s->slot = NULL;
        compiler_fence();
        clear_state(s);
    }
    pthread_mutex_unlock(&registry_lock);
    return native_clear(self, unused);
}

static PyObject *native_record_bytes(PyObject *self, PyObject *unused)
{
    struct otel_thread_ctx_record *r = otel_thread_ctx_v1;
    if (!r)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)r, RECORD_HEADER + r->attrs_data_size);
}

static PyObject *native_address(PyObject *self, PyObject *unused)
{
    return PyLong_FromVoidPtr(otel_thread_ctx_v1);
}

/* Where this thread's otel_thread_ctx_v1 lives, and the thread pointer (fs base on x86_64). */
static PyObject *native_tls_info(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)&otel_thread_ctx_v1),
                         PyLong_FromVoidPtr(__builtin_thread_pointer()));
}

/* ------------------------------------------------------------------------------------------ */
/* OTEP 4719 process context                                                                   */

struct otel_process_ctx_header {
    char signature[8];                  /* "OTEL_CTX", no NUL */
    uint32_t version;                   /* 2 */
    uint32_t payload_size;
    uint64_t monotonic_published_at_ns; /* CLOCK_BOOTTIME; 0 while being changed */
    uint64_t payload;                   /* address of the payload in this process */
} __attribute__((packed, aligned(8)));
_Static_assert(sizeof(struct otel_process_ctx_header) == 32, "32-byte header");
_Static_assert(offsetof(struct otel_process_ctx_header, payload_size) == 12, "size at 12");
_Static_assert(offsetof(struct otel_process_ctx_header, monotonic_published_at_ns) == 16, "ts");
_Static_assert(offsetof(struct otel_process_ctx_header, payload) == 24, "payload at 24");

#define PAYLOAD_MAX 65536 /* readers reject more */

static struct otel_process_ctx_header *pc_mapping;
static size_t pc_mapping_size;
static char *pc_payload;
static int pc_memfd; /* the mapping is a memfd (else anonymous) */
static int pc_named; /* prctl naming succeeded */

static uint64_t boottime_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0)
        clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *map_context(size_t size, int *memfd)
{
    void *m = MAP_FAILED;
    int fd = (int)syscall(SYS_memfd_create, "OTEL_CTX",
                          MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
    if (fd < 0)
        fd = (int)syscall(SYS_memfd_create, "OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)size) == 0)
            m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        close(fd);
    }
    *memfd = m != MAP_FAILED;
    if (m == MAP_FAILED)
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m;
}

static PyObject *native_publish_process_context(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    char *payload, *old;
    uint64_t now;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len <= 0 || view.len > PAYLOAD_MAX) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "payload must be 1..%d bytes", PAYLOAD_MAX);
        return NULL;
    }
    payload = malloc((size_t)view.len);
    if (!payload) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    memcpy(payload, view.buf, (size_t)view.len);

    if (!pc_mapping) {
        long page = sysconf(_SC_PAGESIZE);
        size_t size = page > 0 ? (size_t)page : 4096;
        int memfd;
        void *m = map_context(size, &memfd);
        if (m == MAP_FAILED) {
            free(payload);
            PyBuffer_Release(&view);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        madvise(m, size, MADV_DONTFORK);
        struct otel_process_ctx_header *h = m;
        memcpy(h->signature, "OTEL_CTX", 8);
        h->version = 2;
        h->payload_size = (uint32_t)view.len;
        h->payload = (uint64_t)(uintptr_t)payload;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&h->monotonic_published_at_ns, boottime_ns(), __ATOMIC_RELEASE);
        pc_mapping = h;
        pc_mapping_size = size;
        pc_memfd = memfd;
        old = NULL;
    } else {
        struct otel_process_ctx_header *h = pc_mapping;
        uint64_t prev = __atomic_load_n(&h->monotonic_published_at_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&h->monotonic_published_at_ns, 0, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        h->payload = (uint64_t)(uintptr_t)payload;
        h->payload_size = (uint32_t)view.len;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        now = boottime_ns();
        if (now <= prev)
            now = prev + 1;
        __atomic_store_n(&h->monotonic_published_at_ns, now, __ATOMIC_RELEASE);
        old = pc_payload;
    }
    pc_payload = payload;
    PyBuffer_Release(&view);
    /* Always, even where it fails: eBPF readers watch prctl to notice a (re)publication. */
    pc_named = prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)pc_mapping,
                     (unsigned long)pc_mapping_size, (unsigned long)"OTEL_CTX") == 0;
    free(old);
    return PyLong_FromVoidPtr(pc_mapping);
}

static PyObject *native_unpublish_process_context(PyObject *self, PyObject *unused)
{
    if (pc_mapping) {
        __atomic_store_n(&pc_mapping->monotonic_published_at_ns, 0, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        munmap(pc_mapping, pc_mapping_size);
        pc_mapping = NULL;
        pc_mapping_size = 0;
    }
    free(pc_payload);
    pc_payload = NULL;
    Py_RETURN_NONE;
}

/* (mapping address, mapping size, memfd?, prctl-named?) or None. */
static PyObject *native_process_context_info(PyObject *self, PyObject *unused)
{
    if (!pc_mapping)
        Py_RETURN_NONE;
    return Py_BuildValue("(NnOO)", PyLong_FromVoidPtr(pc_mapping), (Py_ssize_t)pc_mapping_size,
                         pc_memfd ? Py_True : Py_False, pc_named ? Py_True : Py_False);
}

/*
 * In a forked child only the forking thread exists and the context mapping is gone
 * (MADV_DONTFORK). Forget the other threads and the mapping (the payload is left allocated: no
 * malloc call in a child of a multi-threaded parent); the Python side republishes.
 */
static void after_fork_child(void)
{
    struct thread_state *s = peek_state();
    pthread_mutex_init(&registry_lock, NULL);
    registry = NULL;
    if (s && s->registered) {
        s->prev = s->next = NULL;
        registry = s;
    }
    pc_mapping = NULL;
    pc_mapping_size = 0;
    pc_payload = NULL;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef native_methods[] = {
    {"set", (PyCFunction)(void (*)(void))native_set, METH_FASTCALL,
     "set(trace_id, span_id, trace_flags): publish the OpenTelemetry ids (ints) of this "
     "thread; zero ids clear them."},
    {"set_osprofiler", (PyCFunction)(void (*)(void))native_set_osprofiler, METH_FASTCALL,
     "set_osprofiler(base_id, trace_id, parent_id): publish this thread's OSProfiler ids "
     "(str or None each); all None clears them."},
    {"set_all", (PyCFunction)(void (*)(void))native_set_all, METH_FASTCALL,
     "set_all(trace_id, span_id, trace_flags, base_id, osprofiler_trace_id, parent_id): both "
     "halves at once."},
    {"publish_span", native_publish_span, METH_O,
     "publish_span(span): the OpenTelemetry ids of span.get_span_context(), or clear them for "
     "None or an invalid span."},
    {"make_hooks", (PyCFunction)(void (*)(void))native_make_hooks, METH_FASTCALL,
     "make_hooks(inner_attach, inner_detach, inner_get_current, span_key): (attach, detach) "
     "that call the inner ones, then publish the span of the context now current."},
    {"clear", native_clear, METH_NOARGS, "clear(): unpublish this thread's context."},
    {"clear_otel", native_clear_otel, METH_NOARGS, "clear_otel(): clear the OpenTelemetry ids."},
    {"clear_osprofiler", native_clear_osprofiler, METH_NOARGS,
     "clear_osprofiler(): clear the OSProfiler ids."},
    {"clear_all_threads", native_clear_all_threads, METH_NOARGS,
     "clear_all_threads(): unpublish the context of every thread that published one."},
    {"record_bytes", native_record_bytes, METH_NOARGS,
     "record_bytes(): this thread's published record (28 + attrs_data_size bytes) or None."},
    {"address", native_address, METH_NOARGS,
     "address(): the value of this thread's otel_thread_ctx_v1 (0: nothing published)."},
    {"tls_info", native_tls_info, METH_NOARGS,
     "tls_info(): (address of this thread's otel_thread_ctx_v1, thread pointer)."},
    {"publish_process_context", native_publish_process_context, METH_O,
     "publish_process_context(payload): publish (or update) the OTEL_CTX mapping; returns its "
     "address."},
    {"unpublish_process_context", native_unpublish_process_context, METH_NOARGS,
     "unpublish_process_context(): unmap the OTEL_CTX mapping."},
    {"process_context_info", native_process_context_info, METH_NOARGS,
     "process_context_info(): (address, size, is_memfd, prctl_named) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "OTEP 4947 thread context and OTEP 4719 process context publisher.", -1, native_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m;
    static int once;
    str_get_span_context = PyUnicode_InternFromString("get_span_context");
    if (!str_get_span_context)
        return NULL;
    if (!once) {
        once = 1;
        exit_key_ready = pthread_key_create(&exit_key, on_thread_exit) == 0;
        pthread_atfork(NULL, NULL, after_fork_child);
    }
    if (PyType_Ready(&HooksType) < 0)
        return NULL;
    m = PyModule_Create(&native_module);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "RECORD_MAX", RECORD_MAX) ||
        PyModule_AddIntConstant(m, "RECORD_HEADER", RECORD_HEADER) ||
        PyModule_AddIntConstant(m, "KEY_OSP_BASE_ID", KEY_OSP_BASE_ID) ||
        PyModule_AddIntConstant(m, "KEY_OSP_TRACE_ID", KEY_OSP_TRACE_ID) ||
        PyModule_AddIntConstant(m, "KEY_OSP_PARENT_ID", KEY_OSP_PARENT_ID) ||
        PyModule_AddIntConstant(m, "KEY_PY_CONTEXT", KEY_PY_CONTEXT)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
