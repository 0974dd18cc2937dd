#include "engine/context.h"

#include "engine/qp.h"

namespace sv::engine {

namespace {
enum class Affiliation : uint8_t { qp, srq, other };

Affiliation affiliation(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return Affiliation::qp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return Affiliation::srq;
    default:
      return Affiliation::other;
  }
}

// Drops obj's queued events and waits for the retrieved ones' acks (obj->mutex, cond and
// events_completed are the ibv_qp/ibv_srq fields ibv_ack_async_event counts in).
template <class Obj, class Match>
void retire(EventQueue<ibv_async_event>& q, Obj* obj, uint32_t reported, Match match) {
  const auto dropped = q.take_if(match);
  pthread_mutex_lock(&obj->mutex);
  obj->events_completed += static_cast<uint32_t>(dropped.size());
  while (obj->events_completed != reported) pthread_cond_wait(&obj->cond, &obj->mutex);
  pthread_mutex_unlock(&obj->mutex);
}
}  // namespace

void Context::post_async(const ibv_async_event& ev) {
  switch (affiliation(ev.event_type)) {
    case Affiliation::qp: {
      ibv_qp* q = ev.element.qp;
      pthread_mutex_lock(&q->mutex);
      ++Qp::from(q)->events_reported;
      async.push(ev);
      pthread_mutex_unlock(&q->mutex);
      return;
    }
    case Affiliation::srq: {
      ibv_srq* s = ev.element.srq;
      pthread_mutex_lock(&s->mutex);
      ++reinterpret_cast<Srq*>(s)->events_reported;
      async.push(ev);
      pthread_mutex_unlock(&s->mutex);
      return;
    }
    case Affiliation::other:
      async.push(ev);
      return;
  }
}

void Context::retire_async(ibv_qp* qp, uint32_t reported) {
  retire(async, qp, reported, [qp](const ibv_async_event& e) {
    return affiliation(e.event_type) == Affiliation::qp && e.element.qp == qp;
  });
}

void Context::retire_async(ibv_srq* srq, uint32_t reported) {
  retire(async, srq, reported, [srq](const ibv_async_event& e) {
    return affiliation(e.event_type) == Affiliation::srq && e.element.srq == srq;
  });
}

}  // namespace sv::engine
