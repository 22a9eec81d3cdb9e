// Stand-ins for the WebUI globals that javascript/tome.js relies on, for the browser test page only.
// They follow the behaviour documented in docs/webui-contract.md (sections 1.5 and 3.2): script.js
// (gradioApp, onUiLoaded, onUiUpdate, onAfterUiUpdate), ui.js (updateInput) and inputAccordion.js (the
// visible checkbox `<id>-visible-checkbox`, inputAccordionChecked). Written from that description, not copied.

// Not a stand-in but the test's watch on timers, set up before any other script runs: every setTimeout and
// setInterval call whose stack passes through javascript/tome.js (page.py names it with a sourceURL comment),
// and every interval still running, with the stack that started it.
var standinTimers = {fromTome: [], intervals: {}};

(function() {
    var setTimeoutOriginal = window.setTimeout;
    var setIntervalOriginal = window.setInterval;
    var clearTimeoutOriginal = window.clearTimeout;
    var clearIntervalOriginal = window.clearInterval;
    var watch = function(name, start, isInterval) {
        return function() {
            var stack = new Error().stack || '';
            var id = start.apply(window, arguments);
            if (/\btome\.js\b/.test(stack)) {
                standinTimers.fromTome.push(name + ' ' + stack);
            }
            if (isInterval) {
                standinTimers.intervals[id] = stack;
            }
            return id;
        };
    };
    // Timeouts and intervals share one id pool: either clear function stops either.
    var clear = function(original) {
        return function(id) {
            delete standinTimers.intervals[id];
            return original.apply(window, arguments);
        };
    };
    window.setTimeout = watch('setTimeout', setTimeoutOriginal, false);
    window.setInterval = watch('setInterval', setIntervalOriginal, true);
    window.clearTimeout = clear(clearTimeoutOriginal);
    window.clearInterval = clear(clearIntervalOriginal);
})();

function gradioApp() {
    var elems = document.getElementsByTagName('gradio-app');
    var elem = elems.length ? elems[0] : document;
    return elem.shadowRoot ? elem.shadowRoot : elem;
}

var standinUiLoaded = [];
var standinUiUpdate = [];
var standinAfterUiUpdate = [];

function onUiLoaded(callback) {
    standinUiLoaded.push(callback);
}

function onUiUpdate(callback) {
    standinUiUpdate.push(callback);
}

function onAfterUiUpdate(callback) {
    standinAfterUiUpdate.push(callback);
}

// ui.js: tell gradio about a value changed from JS.
function updateInput(target) {
    target.dispatchEvent(new Event('input', {bubbles: true}));
}

// inputAccordion.js: a visible checkbox in the accordion's label row, linked to the hidden gradio checkbox
// `<id>-checkbox` (the script arg) and to the open/closed state.
var standinAccordions = {};

function inputAccordionChecked(id, checked) {
    var accordion = standinAccordions[id];
    accordion.visible.checked = checked;
    accordion.sync();
}

function standinSetupAccordion(accordion) {
    var labelWrap = accordion.querySelector('.label-wrap');
    var hidden = gradioApp().querySelector('#' + accordion.id + '-checkbox input');
    var visible = document.createElement('input');
    visible.type = 'checkbox';
    visible.id = accordion.id + '-visible-checkbox';
    visible.className = hidden.className + ' input-accordion-checkbox'; // gradio's checkbox look
    visible.checked = labelWrap.classList.contains('open');
    labelWrap.querySelector('span').prepend(visible);
    var sync = function() {
        if (labelWrap.classList.contains('open') !== visible.checked) {
            labelWrap.click();
        }
        hidden.checked = visible.checked;
        updateInput(hidden);
    };
    visible.addEventListener('click', function(event) {
        event.stopPropagation(); // the click must not also toggle the accordion through its label
    });
    visible.addEventListener('input', sync);
    standinAccordions[accordion.id] = {visible: visible, sync: sync};
}

onUiLoaded(function() {
    gradioApp().querySelectorAll('.input-accordion').forEach(standinSetupAccordion);
});

// script.js: callbacks run from one MutationObserver; "loaded" is the first time #txt2img_prompt exists.
document.addEventListener('DOMContentLoaded', function() {
    var loaded = false;
    var afterTimer = null;
    var run = function(callbacks, arg) {
        callbacks.forEach(function(callback) {
            try {
                callback(arg);
            } catch (e) {
                console.error('callback failed', e);
            }
        });
    };
    new MutationObserver(function(mutations) {
        if (!loaded && gradioApp().querySelector('#txt2img_prompt')) {
            loaded = true;
            run(standinUiLoaded);
        }
        run(standinUiUpdate, mutations);
        clearTimeout(afterTimer);
        afterTimer = setTimeout(function() {
            run(standinAfterUiUpdate);
        }, 200);
    }).observe(gradioApp(), {childList: true, subtree: true});
});
