from twisted.application.service import ServiceMaker

edgegw = ServiceMaker(
    "edgegw", "edgegw.tap", "HTTP edge gateway configured from YAML resources", "edgegw"
)
