from twisted.application.reactors import Reactor

edgegw_reactor = Reactor(
    "edgegw", "edgegw.reactor", "epoll, without per-event log context, writes flushed per iteration"
)
